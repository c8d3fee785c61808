// Network helpers for tests that open sockets on the loopback interface.
#pragma once

namespace dserve::test {

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, read back and
// released), for a test's listener or rendezvous store.
int free_port();

}  // namespace dserve::test

// Fuzz target: the messages a data-parallel peer sends over ZeroMQ
// (engine/engine_messages.h): one frame, one JSON object, every field checked. The
// input is the frame. A frame that decodes must encode to a frame that decodes to
// the same message (compared through a second encoding): what the head relays is
// what the engine meant.
#include <cstdlib>
#include <string>

#include "engine/engine_messages.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dserve;
  Result<engine_msg::Message> m = engine_msg::decode(fuzz::as_text(data, size));
  if (!m.ok()) return 0;
  const std::string encoded = engine_msg::encode(*m);
  Result<engine_msg::Message> again = engine_msg::decode(encoded);
  if (!again.ok() || engine_msg::encode(*again) != encoded) std::abort();  // no round trip
  if (const auto* hello = std::get_if<engine_msg::Hello>(&*m)) {
    (void)engine_msg::first_difference(hello->config, engine_msg::NodeConfig{});
  }
  return 0;
}

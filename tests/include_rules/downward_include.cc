// Compiled with the kvcache module's include path: its own and base's headers are found.
#include "base/status.h"
#include "kvcache/block_pool.h"

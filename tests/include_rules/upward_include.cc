// Compiled with the kvcache module's include path: model is above kvcache, so its
// header must not be found (include_rule_upward_fails expects exactly that error).
#include "kvcache/block_pool.h"
#include "model/paged_kv_cache.h"

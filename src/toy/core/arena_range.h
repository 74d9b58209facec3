// A range of a parameter arena (ParamStore::pack): what the optimizer updates in one call
// and, later, what a data-parallel bucket or an optimizer shard covers.
#pragma once
#include <cstdint>

namespace toy {

struct ArenaRange {
  int64_t begin = 0, end = 0;  // elements [begin, end)
  bool decay = false;          // AdamW's weight decay applies (matrices)
};

}  // namespace toy

// cuda-emu: stands in for <cub/...> in the converted kernel files (convert.py swaps the
// include). Only cub::DeviceRadixSort::SortPairs and SortPairsDescending, the calls toy's
// kernels make (rows.cu, sample.cu), as a host stable sort: the emulator's device memory is
// host memory. It gives the results cub documents, not cub's algorithm:
//   - stable (equal keys keep their input order), keys compared on bits [begin_bit, end_bit);
//   - floats in radix order: -0 sorts as +0 (as CUB 2.x does), NaNs by their bits, positive
//     ones past +inf and negative ones before -inf;
//   - the temporary storage query (d_temp_storage == nullptr) asks for 64 bytes.
// Anything else of cub does not compile here: add it when a kernel needs it.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

namespace cub {
namespace host_sort {

// The key as an unsigned number whose order is cub's radix order.
template <class K>
uint64_t radix_bits(K k) {
  if constexpr (std::is_same_v<K, float>) {
    uint32_t u;
    std::memcpy(&u, &k, 4);
    if (u == 0x80000000u) u = 0;  // -0 as +0
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  } else {
    static_assert(std::is_integral_v<K>, "cub_host_sort.h sorts float and integer keys");
    return uint64_t(std::make_unsigned_t<K>(k)) ^ (std::is_signed_v<K> ? uint64_t(1) << (sizeof(K) * 8 - 1) : 0);
  }
}

template <class K, class V>
cudaError_t sort_pairs(bool descending, void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out,
                       const V* values_in, V* values_out, int64_t n, int begin_bit, int end_bit) {
  if (!temp) {
    temp_bytes = 64;
    return cudaSuccess;
  }
  const uint64_t high = end_bit >= 64 ? ~uint64_t(0) : (uint64_t(1) << end_bit) - 1;
  const uint64_t mask = high & ~((uint64_t(1) << begin_bit) - 1);
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), int64_t(0));
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
    const uint64_t x = radix_bits(keys_in[a]) & mask, y = radix_bits(keys_in[b]) & mask;
    return descending ? x > y : x < y;
  });
  std::vector<K> keys(static_cast<size_t>(n));
  std::vector<V> values(static_cast<size_t>(n));
  for (size_t i = 0; i < idx.size(); ++i) keys[i] = keys_in[idx[i]], values[i] = values_in[idx[i]];
  std::copy(keys.begin(), keys.end(), keys_out);
  std::copy(values.begin(), values.end(), values_out);
  return cudaSuccess;
}

}  // namespace host_sort

struct DeviceRadixSort {
  template <class K, class V, class N>
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out, const V* values_in,
                               V* values_out, N n, int begin_bit = 0, int end_bit = sizeof(K) * 8,
                               cudaStream_t = nullptr) {
    return host_sort::sort_pairs(false, temp, temp_bytes, keys_in, keys_out, values_in, values_out, int64_t(n),
                                 begin_bit, end_bit);
  }
  template <class K, class V, class N>
  static cudaError_t SortPairsDescending(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out,
                                         const V* values_in, V* values_out, N n, int begin_bit = 0,
                                         int end_bit = sizeof(K) * 8, cudaStream_t = nullptr) {
    return host_sort::sort_pairs(true, temp, temp_bytes, keys_in, keys_out, values_in, values_out, int64_t(n),
                                 begin_bit, end_bit);
  }
};

}  // namespace cub

#include "beam_code.h"

#include <sys/uio.h>
#include <unistd.h>

#include "proc_maps.h"

namespace mi::symbolize {

bool is_atom_term(uint64_t w, AtomBound atoms) {
  return (w & 0x3F) == 0x0B && (w >> 6) < atoms.count;
}

std::optional<BeamMfa> BeamCodeNamer::name(uint64_t address, uint64_t floor, AtomBound atoms) {
  // The header's arity word ends at most at the function's first byte,
  // which is at or before the return address's call instruction.
  uint64_t end = (address & ~uint64_t{7});
  if (end <= floor) return std::nullopt;
  const uint64_t lowest = end - floor > kMaxScan ? end - kMaxScan : floor;
  constexpr size_t kChunkWords = 512;
  buf_.resize(kChunkWords + 4);
  // Read backwards in chunks, keeping the four words above a chunk so a
  // header that straddles two chunks is seen whole.
  uint64_t carry[4] = {};
  size_t carried = 0;
  while (end > lowest) {
    const uint64_t start = end - lowest > kChunkWords * 8 ? end - kChunkWords * 8 : lowest;
    const size_t words = static_cast<size_t>((end - start) / 8);
    if (words == 0 || !read_(ctx_, start, buf_.data(), words * 8)) return std::nullopt;
    for (size_t i = 0; i < carried; ++i) buf_[words + i] = carry[i];
    const size_t total = words + carried;
    // w[i] = u (breakpoint: 0 or a pointer), w[i+1] module, w[i+2]
    // function, w[i+3] arity: the nearest one below `address` wins.
    for (size_t i = total >= 4 ? total - 4 + 1 : 0; i-- > 0;) {
      const uint64_t u = buf_[i], m = buf_[i + 1], f = buf_[i + 2], a = buf_[i + 3];
      if (a < 256 && is_atom_term(m, atoms) && is_atom_term(f, atoms) && (u & 7) == 0)
        return BeamMfa{m, f, a};
    }
    carried = words < 3 ? words : 3;
    for (size_t i = 0; i < carried; ++i) carry[i] = buf_[i];
    end = start;
  }
  return std::nullopt;
}

bool read_own_memory(void*, uint64_t address, void* out, size_t len) {
  iovec local{out, len};
  iovec remote{reinterpret_cast<void*>(address), len};
  return ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(len);
}

std::vector<std::optional<BeamMfa>> name_beam_addresses(const std::vector<uint64_t>& addresses,
                                                        AtomBound atoms) {
  std::vector<std::optional<BeamMfa>> out(addresses.size());
  if (addresses.empty()) return out;
  const std::vector<detail::Mapping> maps = detail::read_self_maps();
  BeamCodeNamer namer(read_own_memory, nullptr);
  for (size_t i = 0; i < addresses.size(); ++i) {
    const detail::Mapping* m = detail::find_mapping(maps, addresses[i]);
    // JIT code: unnamed (+JPperf, or OTP 25's single mapping) or the memfd.
    if (m == nullptr || !(m->name.empty() || m->name.starts_with("/memfd:vmem"))) continue;
    out[i] = namer.name(addresses[i], m->start, atoms);
  }
  return out;
}

}  // namespace mi::symbolize

#include "elf_symbols.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the ELF reader only accepts native little-endian ELF64");

namespace mi::symbolize::detail {
namespace {

bool in_bounds(size_t size, uint64_t offset, uint64_t length) {
  return offset <= size && length <= size - offset;
}

// Every read goes through memcpy: section offsets in a hostile or odd file
// need not be aligned, and UBSan rightly objects to misaligned loads.
template <class T>
bool read_at(const uint8_t* base, size_t size, uint64_t offset, T* out) {
  if (!in_bounds(size, offset, sizeof(T))) return false;
  std::memcpy(out, base + offset, sizeof(T));
  return true;
}

// A bounds-checked view of an ELF64 image's section headers.
class Image {
 public:
  Image(const void* data, size_t size) : data_(static_cast<const uint8_t*>(data)), size_(size) {
    Elf64_Ehdr eh;
    if (!read_at(data_, size_, 0, &eh)) return;
    if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        eh.e_ident[EI_DATA] != ELFDATA2LSB) {
      return;
    }
    valid_ = true;
    if (eh.e_shoff == 0 || eh.e_shentsize != sizeof(Elf64_Shdr)) return;
    uint64_t count = eh.e_shnum;
    if (count == 0) {
      // Extended numbering: the real count is in section 0's sh_size.
      Elf64_Shdr first;
      if (!read_at(data_, size_, eh.e_shoff, &first)) return;
      count = first.sh_size;
    }
    if (count > size_ / sizeof(Elf64_Shdr) ||
        !in_bounds(size_, eh.e_shoff, count * sizeof(Elf64_Shdr))) {
      return;
    }
    shoff_ = eh.e_shoff;
    section_count_ = count;
  }

  bool valid() const { return valid_; }
  size_t section_count() const { return section_count_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

  bool section(size_t index, Elf64_Shdr* out) const {
    if (index >= section_count_) return false;
    return read_at(data_, size_, shoff_ + index * sizeof(Elf64_Shdr), out);
  }

  // The file contents of a section, when they lie inside the image.
  bool contents(const Elf64_Shdr& sh, const uint8_t** begin, size_t* length) const {
    if (sh.sh_type == SHT_NOBITS || !in_bounds(size_, sh.sh_offset, sh.sh_size)) return false;
    *begin = data_ + sh.sh_offset;
    *length = sh.sh_size;
    return true;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  bool valid_ = false;
  uint64_t shoff_ = 0;
  size_t section_count_ = 0;
};

// A read-only private mapping of a whole file.
class MappedFile {
 public:
  static std::optional<MappedFile> open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return std::nullopt;
    struct stat st;
    void* data = MAP_FAILED;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
        static_cast<uint64_t>(st.st_size) >= sizeof(Elf64_Ehdr)) {
      data = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    }
    ::close(fd);
    if (data == MAP_FAILED) return std::nullopt;
    return MappedFile(data, static_cast<size_t>(st.st_size));
  }

  MappedFile(MappedFile&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  MappedFile& operator=(MappedFile&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    return *this;
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(data_, size_);
  }

  const void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  MappedFile(void* data, size_t size) : data_(data), size_(size) {}
  void* data_;
  size_t size_;
};

int binding_rank(unsigned char info) {
  switch (ELF64_ST_BIND(info)) {
    case STB_GLOBAL:
      return 0;
    case STB_WEAK:
      return 1;
    case STB_LOCAL:
      return 2;
    default:
      return 3;
  }
}

int leading_underscores(std::string_view name) {
  const size_t n = name.find_first_not_of('_');
  return static_cast<int>(n == std::string_view::npos ? name.size() : n);
}

}  // namespace

// Gathers candidates (names still pointing into the mapped images), then
// chooses one name per address and copies the names out, so the images can
// be unmapped.
class SymbolCollector {
 public:
  // Adds the function symbols of every SHT_SYMTAB/SHT_DYNSYM section;
  // returns whether a .symtab with contents was seen.
  bool add(const Image& image) {
    bool saw_symtab = false;
    Elf64_Shdr sh;
    for (size_t i = 0; i < image.section_count(); ++i) {
      if (!image.section(i, &sh)) continue;
      if (sh.sh_type != SHT_SYMTAB && sh.sh_type != SHT_DYNSYM) continue;
      if (add_section(image, sh) && sh.sh_type == SHT_SYMTAB) saw_symtab = true;
    }
    return saw_symtab;
  }

  SymbolTable finish() {
    std::sort(candidates_.begin(), candidates_.end(), [](const Candidate& a, const Candidate& b) {
      if (a.start != b.start) return a.start < b.start;
      if (a.binding != b.binding) return a.binding < b.binding;
      if (a.underscores != b.underscores) return a.underscores < b.underscores;
      return a.name < b.name;
    });
    SymbolTable table;
    table.symbols_.reserve(candidates_.size());
    for (size_t i = 0; i < candidates_.size(); ++i) {
      const Candidate& c = candidates_[i];
      if (i > 0 && candidates_[i - 1].start == c.start) continue;  // best alias came first
      if (table.names_.size() + c.name.size() > std::numeric_limits<uint32_t>::max()) break;
      table.symbols_.push_back(SymbolTable::Symbol{c.start, c.size,
                                                   static_cast<uint32_t>(table.names_.size()),
                                                   static_cast<uint32_t>(c.name.size())});
      table.names_.append(c.name);
    }
    table.symbols_.shrink_to_fit();
    candidates_.clear();
    return table;
  }

 private:
  struct Candidate {
    uint64_t start;
    uint64_t size;
    std::string_view name;
    int binding;
    int underscores;
  };

  bool add_section(const Image& image, const Elf64_Shdr& sh) {
    const uint8_t* syms = nullptr;
    size_t syms_size = 0;
    if (!image.contents(sh, &syms, &syms_size)) return false;
    const uint64_t entsize = sh.sh_entsize != 0 ? sh.sh_entsize : sizeof(Elf64_Sym);
    if (entsize < sizeof(Elf64_Sym)) return false;
    Elf64_Shdr strsh;
    const uint8_t* strtab = nullptr;
    size_t strtab_size = 0;
    if (!image.section(sh.sh_link, &strsh) || strsh.sh_type != SHT_STRTAB ||
        !image.contents(strsh, &strtab, &strtab_size)) {
      return false;
    }
    const size_t count = syms_size / entsize;
    bool any = false;
    for (size_t i = 0; i < count; ++i) {
      Elf64_Sym sym;
      std::memcpy(&sym, syms + i * entsize, sizeof(sym));
      const unsigned type = ELF64_ST_TYPE(sym.st_info);
      if (type != STT_FUNC && type != STT_GNU_IFUNC) continue;
      if (sym.st_shndx == SHN_UNDEF || sym.st_size == 0 || sym.st_name >= strtab_size) continue;
      const char* name = reinterpret_cast<const char*>(strtab + sym.st_name);
      const void* nul = std::memchr(name, '\0', strtab_size - sym.st_name);
      if (nul == nullptr || nul == name) continue;
      const std::string_view view(name, static_cast<const char*>(nul) - name);
      candidates_.push_back(Candidate{sym.st_value, sym.st_size, view, binding_rank(sym.st_info),
                                      leading_underscores(view)});
      any = true;
    }
    return any;
  }

  std::vector<Candidate> candidates_;
};

SymbolTable SymbolTable::from_image(const void* data, size_t size) {
  const Image image(data, size);
  SymbolCollector collector;
  const bool has_symtab = image.valid() && collector.add(image);
  SymbolTable table = collector.finish();
  table.has_symtab_ = has_symtab;
  return table;
}

std::optional<SymbolTable> SymbolTable::load_file(const std::string& path,
                                                  const std::string& debug_dir) {
  std::optional<MappedFile> file = MappedFile::open(path);
  if (!file) return std::nullopt;
  const Image image(file->data(), file->size());
  if (!image.valid()) return std::nullopt;

  SymbolCollector collector;
  const bool has_symtab = collector.add(image);
  bool used_debug_file = false;
  // Declared here: the collector's names point into it until finish().
  std::optional<MappedFile> debug_file;
  if (!has_symtab && !debug_dir.empty()) {
    const std::string id = build_id_hex(file->data(), file->size());
    if (id.size() > 2) {
      debug_file = MappedFile::open(debug_dir + "/.build-id/" + id.substr(0, 2) + "/" +
                                    id.substr(2) + ".debug");
      if (debug_file) {
        const Image debug_image(debug_file->data(), debug_file->size());
        // Only its .symtab matters: its .dynsym is NOBITS, and ours is in.
        used_debug_file = debug_image.valid() && collector.add(debug_image);
      }
    }
  }
  SymbolTable table = collector.finish();
  table.has_symtab_ = has_symtab || used_debug_file;
  table.used_debug_file_ = used_debug_file;
  return table;
}

std::optional<SymbolTable::Hit> SymbolTable::lookup(uint64_t vaddr) const {
  auto it = std::upper_bound(symbols_.begin(), symbols_.end(), vaddr,
                             [](uint64_t a, const Symbol& s) { return a < s.start; });
  // The nearest start below may be a small symbol nested in (or after) a
  // bigger one that covers vaddr; look back a little for such a container.
  constexpr int kMaxLookBack = 8;
  for (int step = 0; step < kMaxLookBack && it != symbols_.begin(); ++step) {
    --it;
    if (vaddr - it->start < it->size) {
      return Hit{std::string_view(names_.data() + it->name_offset, it->name_size), it->start,
                 it->size};
    }
  }
  return std::nullopt;
}

std::string build_id_hex(const void* data, size_t size) {
  const Image image(data, size);
  if (!image.valid()) return {};
  static constexpr char kHex[] = "0123456789abcdef";
  Elf64_Shdr sh;
  for (size_t i = 0; i < image.section_count(); ++i) {
    const uint8_t* notes = nullptr;
    size_t length = 0;
    if (!image.section(i, &sh) || sh.sh_type != SHT_NOTE || !image.contents(sh, &notes, &length)) {
      continue;
    }
    uint64_t pos = 0;
    Elf64_Nhdr nh;
    while (read_at(notes, length, pos, &nh)) {
      const uint64_t name_at = pos + sizeof(nh);
      const uint64_t desc_at = name_at + ((uint64_t{nh.n_namesz} + 3) & ~uint64_t{3});
      const uint64_t next = desc_at + ((uint64_t{nh.n_descsz} + 3) & ~uint64_t{3});
      if (!in_bounds(length, desc_at, nh.n_descsz) || next > length) break;
      if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 &&
          std::memcmp(notes + name_at, "GNU", 4) == 0 && nh.n_descsz > 0) {
        std::string hex;
        hex.reserve(2 * nh.n_descsz);
        for (uint32_t b = 0; b < nh.n_descsz; ++b) {
          hex.push_back(kHex[notes[desc_at + b] >> 4]);
          hex.push_back(kHex[notes[desc_at + b] & 0xf]);
        }
        return hex;
      }
      pos = next;
    }
  }
  return {};
}

}  // namespace mi::symbolize::detail

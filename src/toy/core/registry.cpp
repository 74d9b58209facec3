#include "toy/core/registry.h"

namespace toy {

std::atomic<uint64_t> g_kernel_generation{1};

void Registry::define_op(OpInfo info) {
  TOY_CHECK(find_op(info.name) == nullptr, "[registry] op '{}' defined twice", info.name);
  ops_.push_back(std::move(info));
}

const OpInfo* Registry::find_op(std::string_view name) const {
  for (const auto& o : ops_)
    if (o.name == name) return &o;
  return nullptr;
}

void Registry::register_kernel(std::string_view kernel, Device d, void* fn, const std::type_info& sig) {
  auto& slot = kernels_[std::string(kernel)][int(d)];
  TOY_CHECK(slot.fn == nullptr, "[registry] kernel '{}' registered twice for {}", kernel, name(d));
  slot.fn = fn;
  slot.sig = &sig;
}

bool Registry::has_kernel(std::string_view kernel, Device d) const {
  auto it = kernels_.find(kernel);
  return it != kernels_.end() && it->second[int(d)].fn != nullptr && !it->second[int(d)].withheld;
}

void* Registry::find_kernel(std::string_view kernel, Device d, const std::type_info& sig) const {
  return has_kernel(kernel, d) ? this->kernel(kernel, d, sig) : nullptr;
}

void Registry::withhold(std::string_view kernel, Device d, bool withheld) {
  auto it = kernels_.find(kernel);
  TOY_CHECK(it != kernels_.end() && it->second[int(d)].fn != nullptr, "[registry] no {} kernel '{}' to withhold",
            name(d), kernel);
  it->second[int(d)].withheld = withheld;
  g_kernel_generation.fetch_add(1, std::memory_order_relaxed);
}

WithheldKernels::WithheldKernels(std::vector<std::string> kernels, Device d) : kernels_(std::move(kernels)), d_(d) {
  for (const std::string& k : kernels_) registry().withhold(k, d_, true);
}

WithheldKernels::~WithheldKernels() {
  for (const std::string& k : kernels_) registry().withhold(k, d_, false);
}

void* Registry::kernel(std::string_view kernel, Device d, const std::type_info& sig) const {
  auto it = kernels_.find(kernel);
  TOY_CHECK(it != kernels_.end() && it->second[int(d)].fn != nullptr && !it->second[int(d)].withheld,
            "[{}] has no {} kernel{}", kernel, name(d),
            d != Device::CUDA        ? ""
            : has_backend(Device::CUDA) ? " (the CUDA backend has not ported it yet: `toy ops` lists what runs on cuda)"
                                        : " (toy was built without CUDA)");
  const Entry& e = it->second[int(d)];
  TOY_CHECK(*e.sig == sig, "[registry] kernel '{}' was registered with a different signature", kernel);
  return e.fn;
}

bool Registry::has_own_kernels(const OpInfo& op, Device d) const {
  if (!has_backend(d)) return false;
  for (const auto& k : op.uses)
    if (!has_kernel(k, d)) return false;
  return true;
}

bool Registry::supports(const OpInfo& op, Device d) const {
  if (has_own_kernels(op, d)) return true;
  if (op.fallback_uses.empty() || !has_backend(d)) return false;
  for (const auto& k : op.fallback_uses)
    if (!has_kernel(k, d)) return false;
  return true;
}

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry();
    install_all(*reg);
    return reg;
  }();
  return *r;
}

}  // namespace toy

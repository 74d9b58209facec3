#include "toy/core/registry.h"

namespace toy {

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
  return it != kernels_.end() && it->second[int(d)].fn != nullptr;
}

void* Registry::kernel(std::string_view kernel, Device d, const std::type_info& sig) const {
  auto it = kernels_.find(kernel);
  TOY_CHECK(it != kernels_.end() && it->second[int(d)].fn != nullptr, "[{}] has no {} kernel{}", kernel, name(d),
            d == Device::CUDA ? " (toy was built without CUDA, or the op is not ported yet)" : "");
  const Entry& e = it->second[int(d)];
  TOY_CHECK(*e.sig == sig, "[registry] kernel '{}' was registered with a different signature", kernel);
  return e.fn;
}

bool Registry::supports(const OpInfo& op, Device d) const {
  if (!has_backend(d)) return false;
  for (const auto& k : op.uses)
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

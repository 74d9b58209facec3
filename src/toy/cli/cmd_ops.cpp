// `toy ops`: the op table — primitive or composite, devices, backward rule, gradient test.
#include <nlohmann/json.hpp>

#include <cstdio>

#include "toy/cli/commands.h"
#include "toy/core/registry.h"

namespace toy::cli {

Run add_ops_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("ops", "Print the op table (name, kind, devices, backward, gradient test)");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Print a JSON array, one object per op");
  return [json]() {
    const Registry& r = registry();
    if (*json) {
      nlohmann::json arr = nlohmann::json::array();
      // Per device: whether the op runs forward, has a backward there, and runs through its
      // composite form (other ops' kernels) rather than a kernel of its own: always for a
      // composite op, for a fused op where the device lacks its kernels.
      std::vector<Device> devices = {Device::CPU, Device::SIM};
      if (r.has_backend(Device::CUDA)) devices.push_back(Device::CUDA);
      for (const OpInfo& op : r.ops()) {
        nlohmann::json per_device = nlohmann::json::object();
        for (Device d : devices) {
          const bool runs = r.supports(op, d);
          per_device[std::string(name(d))] = {{"forward", runs}, {"backward", runs && op.backward},
                                             {"fallback", runs && (!op.primitive || !r.has_own_kernels(op, d))}};
        }
        arr.push_back({{"name", op.name},
                       {"devices", per_device},
                       {"primitive", op.primitive},
                       {"cpu", r.supports(op, Device::CPU)},
                       {"cuda", r.supports(op, Device::CUDA)},
                       {"backward", op.backward},
                       {"grad_test", op.grad_test},
                       {"kernels", op.uses},
                       {"summary", op.summary}});
      }
      std::printf("%s\n", arr.dump(2).c_str());
      return 0;
    }
    std::printf("%-14s %-10s %-4s %-4s %-5s %-9s %-24s %s\n", "op", "kind", "cpu", "sim", "cuda", "backward",
                "grad test", "what");
    for (const OpInfo& op : r.ops()) {
      std::printf("%-14s %-10s %-4s %-4s %-5s %-9s %-24s %s\n", op.name.c_str(), !op.primitive ? "composite" : op.fallback_uses.empty() ? "primitive" : "fused",
                  r.supports(op, Device::CPU) ? "yes" : "no", r.supports(op, Device::SIM) ? "yes" : "no",
                  r.supports(op, Device::CUDA) ? "yes" : "no",
                  op.backward ? "yes" : "no", op.grad_test.c_str(), op.summary.c_str());
    }
    std::printf("\n%zu ops. Primitive ops run their own kernels; composites are built from other ops, so\n"
                "autograd and every backend come with them. A fused op (kind 'fused') is a primitive with a\n"
                "composite form: it runs on a device whose backend lacks its kernels.\n",
                r.ops().size());
    return 0;
  };
}

}  // namespace toy::cli

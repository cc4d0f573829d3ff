// The in-place and out= overloads of a functional op, by name and schema. See core/OpVariants.h.
#include "core/OpVariants.h"

#include "core/OpSchemaInfo.h"

#include <string>
#include <vector>

namespace tfz::detail {

bool is_view_op(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  return !schema.is_mutable() && schema.returns().size() == 1 &&
         schema.returns()[0].alias_info() != nullptr;
}

std::optional<c10::OperatorHandle> in_place_twin(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  if (schema.is_mutable() || schema.returns().size() != 1 ||
      schema.returns()[0].alias_info() != nullptr || schema.arguments().empty()) {
    return std::nullopt;
  }
  const auto& result_type = *schema.returns()[0].type();
  const bool one_tensor = result_type.isSubtypeOf(*c10::TensorType::get());
  if (!one_tensor && !result_type.isSubtypeOf(*c10::ListType::ofTensors())) return std::nullopt;
  auto twin = c10::Dispatcher::singleton().findOp({schema.name() + "_", schema.overload_name()});
  if (!twin) return std::nullopt;
  const auto& args = schema.arguments();
  const auto& twin_args = twin->schema().arguments();
  if (twin_args.size() != args.size() || twin_args[0].alias_info() == nullptr ||
      !twin_args[0].alias_info()->isWrite() ||
      twin->schema().returns().size() != (one_tensor ? 1U : 0U)) {
    return std::nullopt;
  }
  for (size_t a = 0; a < args.size(); ++a) {
    if (*args[a].type() != *twin_args[a].type() || args[a].name() != twin_args[a].name()) {
      return std::nullopt;
    }
  }
  return twin;
}

std::optional<c10::OperatorHandle> out_variant(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  if (schema.is_mutable() || schema.returns().size() != 1 ||
      schema.returns()[0].alias_info() != nullptr ||
      !schema.returns()[0].type()->isSubtypeOf(*c10::TensorType::get())) {
    return std::nullopt;
  }
  const std::string& overload = schema.overload_name();
  std::vector<std::string> names{"out"};
  if (!overload.empty()) names.push_back(overload + "_out");
  if (const auto cut = overload.find('_'); cut != std::string::npos) {
    names.push_back(overload.substr(cut + 1) + "_out");
  }
  const auto& args = schema.arguments();
  for (const auto& name : names) {
    auto candidate = c10::Dispatcher::singleton().findOp({schema.name(), name});
    if (!candidate) continue;
    const auto& cargs = candidate->schema().arguments();
    if (cargs.size() != args.size() + 1 || !is_out_argument(cargs.back()) ||
        candidate->schema().returns().size() != 1) {
      continue;
    }
    bool same = true;
    for (size_t a = 0; a < args.size() && same; ++a) {
      same = *args[a].type() == *cargs[a].type() && args[a].name() == cargs[a].name();
    }
    if (same) return candidate;
  }
  return std::nullopt;
}

}  // namespace tfz::detail

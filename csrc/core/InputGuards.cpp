// Input guards of captured graphs: recording and checking. See core/InputGuards.h.
#include "core/InputGuards.h"

#include "core/Layout.h"

#include <c10/util/Exception.h>

#include <sstream>
#include <unordered_map>

namespace tfz::detail {

// Note [Capture: guards on inputs]
// A captured graph is one concrete program: sizes, strides and dtypes it read from its inputs are
// constants in it (`x.new_zeros(x.shape[0])` records new_zeros(x, [3])), and its input groups and
// epilogue follow which inputs shared memory when it was captured. Replayed on inputs that differ
// in any of those, it ran and returned numbers of the captured shapes, silently wrong (a size-3
// result for a size-5 input). So capture records each input's sizes, strides, storage offset,
// dtype, device, requires_grad, conjugate/negative bits and alias group before the program runs
// (and the storage's size where the graph reads the storage whole: an input that does not span
// its small storage, or one sharing it, Note [Inputs: storage coordinates under a tracer]),
// and every replay (the FX module capture returns, tfz::CapturedGraph) checks them first and
// raises naming the input and both values. The device is not checked where either side is
// meta: a graph captured on meta tensors (nothing computed) runs on any device, and a meta
// replay is a shape check; a device the program read is then a meta constant in a node, which
// fails loudly next to real tensors. Strides are checked although most programs do not read them:
// which ones do (as_strided, view, the epilogue's region writes) is not known without analysing
// every node. Rejected: guard nodes at the start of the graph (every pass, compiler and graph
// comparison would meet a dozen nodes per input that make_fx's graphs do not have; values read
// inside the program do get nodes, Note [Capture: guards on values read]), and checking sizes
// only (a graph captured with two aliased inputs is wrong on distinct ones, and the reverse).
// Graphs that replay on other sizes are make_fx(functionalize(f), tracing_mode="symbolic")'s.

namespace {

// For each input, the first input sharing its storage (itself if none; -1 without storage).
std::vector<int64_t> alias_groups(const std::vector<at::Tensor>& inputs) {
  std::vector<int64_t> groups(inputs.size(), -1);
  const auto storage_of = [&](size_t i) -> const c10::StorageImpl* {
    const at::Tensor& t = inputs[i];
    return t.defined() && t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
  };
  if (inputs.size() <= 8) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto* s = storage_of(i);
      if (s == nullptr) continue;
      groups[i] = static_cast<int64_t>(i);
      for (size_t j = 0; j < i; ++j) {
        if (storage_of(j) == s) {
          groups[i] = groups[j];
          break;
        }
      }
    }
    return groups;
  }
  std::unordered_map<const c10::StorageImpl*, int64_t> first_of;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto* s = storage_of(i);
    if (s != nullptr) groups[i] = first_of.emplace(s, static_cast<int64_t>(i)).first->second;
  }
  return groups;
}

}  // namespace

std::vector<InputGuard> record_input_guards(const std::vector<at::Tensor>& inputs) {
  std::vector<InputGuard> guards(inputs.size());
  const auto groups = alias_groups(inputs);
  std::vector<int> members(inputs.size(), 0);  // inputs per group, indexed by its first input
  for (const int64_t g : groups) {
    if (g >= 0) ++members[g];
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    InputGuard& g = guards[i];
    if (!t.defined()) continue;
    g.defined = true;
    g.sizes = t.sizes().vec();
    g.dtype = t.scalar_type();
    g.device = t.device();
    g.requires_grad = t.requires_grad();
    g.conj = t.is_conj();
    g.neg = t.is_neg();
    if (t.layout() == at::kStrided) {
      g.strides = t.strides().vec();
      g.storage_offset = t.storage_offset();
    }
    g.alias_group = groups[i];
    if (plain_strided(t) &&
        (members[groups[i]] > 1 || (flat_base_suits(t) && !spans_its_storage(t)))) {
      g.storage_nbytes = static_cast<int64_t>(t.storage().nbytes());
    }
  }
  return guards;
}

namespace {

template <class T>
std::string str(const T& v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

}  // namespace

void check_input_guards(const std::vector<InputGuard>& guards,
                        const std::vector<at::Tensor>& inputs,
                        const std::vector<std::string>& names) {
  TORCH_CHECK(inputs.size() == guards.size(), "capture: the graph takes ", guards.size(),
              " tensors, got ", inputs.size(), ".");
  const auto fail = [&](size_t i, const char* what, const std::string& then,
                        const std::string& now) {
    const std::string name = i < names.size() ? names[i] : "input " + std::to_string(i);
    TORCH_CHECK(
        false, "capture: the graph was captured for ", name, " with ", what, " ", then,
        " and is called with ", now,
        ". A captured graph is specialized on its inputs' sizes, strides, storage layout, dtype, "
        "device, requires_grad and which inputs share memory (Note [Capture: guards on inputs]): "
        "capture again for these inputs, or use make_fx(functionalize(f), "
        "tracing_mode=\"symbolic\") for a graph of symbolic sizes.");
  };
  for (size_t i = 0; i < guards.size(); ++i) {
    const InputGuard& g = guards[i];
    const at::Tensor& t = inputs[i];
    if (g.defined != t.defined()) {
      fail(i, "a tensor that is", g.defined ? "defined" : "undefined",
           t.defined() ? "a defined one" : "an undefined one");
    }
    if (!g.defined) continue;
    if (t.sizes() != at::IntArrayRef(g.sizes)) {
      fail(i, "sizes", str(at::IntArrayRef(g.sizes)), str(t.sizes()));
    }
    if (t.scalar_type() != g.dtype) fail(i, "dtype", str(g.dtype), str(t.scalar_type()));
    if (t.device() != g.device && !t.is_meta() && g.device.type() != at::kMeta) {
      fail(i, "device", str(g.device), str(t.device()));
    }
    if (t.layout() == at::kStrided && !g.strides.empty() &&
        t.strides() != at::IntArrayRef(g.strides)) {
      fail(i, "strides", str(at::IntArrayRef(g.strides)), str(t.strides()));
    }
    if (t.layout() == at::kStrided && t.storage_offset() != g.storage_offset) {
      fail(i, "storage offset", std::to_string(g.storage_offset),
           std::to_string(t.storage_offset()));
    }
    if (g.storage_nbytes >= 0 && t.has_storage() &&
        static_cast<int64_t>(t.storage().nbytes()) != g.storage_nbytes) {
      fail(i, "a storage of", std::to_string(g.storage_nbytes) + " bytes",
           std::to_string(t.storage().nbytes()) + " bytes");
    }
    if (t.requires_grad() != g.requires_grad) {
      fail(i, "requires_grad", g.requires_grad ? "True" : "False",
           t.requires_grad() ? "True" : "False");
    }
    if (t.is_conj() != g.conj || t.is_neg() != g.neg) {
      fail(i, "conjugate/negative bits", str(g.conj) + "/" + str(g.neg),
           str(t.is_conj()) + "/" + str(t.is_neg()));
    }
  }
  // Alias groups: recomputed on the replay's inputs and compared (one storage test per input
  // pair when there are few, as for most graphs; a map otherwise).
  const auto now = alias_groups(inputs);
  for (size_t i = 0; i < guards.size(); ++i) {
    if (now[i] == guards[i].alias_group) continue;
    const auto group = [&](int64_t g) {
      return g < 0 || g == static_cast<int64_t>(i)
                 ? std::string("no earlier input")
                 : (static_cast<size_t>(g) < names.size() ? names[g] : "input " + str(g));
    };
    fail(i, "memory shared with", group(guards[i].alias_group), group(now[i]));
  }
}

}  // namespace tfz::detail

// Unit tests of the memory-overlap analysis (core/MemoryOverlap.h). Every expectation comes from
// eager PyTorch on real memory: a tensor's elements are the storage indices it reads from an
// arange storage (self-overlap, spans), and two tensors overlap when a write through one changes
// a byte the other reads. See Note [Kernel: writes that read their own memory].
#include "core/MemoryOverlap.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

using namespace tfz::detail;

namespace {

// The storage indices `sizes`/`strides`/`offset` address, read eagerly off an arange storage.
at::Tensor addressed(at::IntArrayRef sizes, at::IntArrayRef strides, int64_t offset = 0) {
  const at::Tensor storage = at::arange(64, at::kLong);
  return storage.as_strided(sizes, strides, offset);
}

bool eager_self_overlap(at::IntArrayRef sizes, at::IntArrayRef strides) {
  const at::Tensor t = addressed(sizes, strides);
  return std::get<0>(at::_unique(t.flatten())).numel() < t.numel();
}

// Whether writing every byte of `a` changes a byte `b` reads: both are views of one zeroed byte
// storage, built by `make` from it.
template <typename Make>
bool eager_overlap(Make&& make) {
  const at::Tensor bytes = at::zeros({256}, at::kByte);
  auto [a, b] = make(bytes);
  const auto same_size_int = [](const at::Tensor& t) {
    switch (t.itemsize()) {
      case 1:
        return t.view(at::kByte);
      case 2:
        return t.view(at::kShort);
      case 4:
        return t.view(at::kInt);
      default:
        return t.view(at::kLong);
    }
  };
  same_size_int(a).fill_(-1);  // every byte of a's elements becomes 0xFF
  return same_size_int(b).ne(0).any().item().toBool();
}

}  // namespace

TEST(MaySelfOverlap, AgreesWithEagerWhereExact) {
  struct Case {
    std::vector<int64_t> sizes, strides;
  };
  const std::vector<Case> cases = {
      {{4}, {1}},        // contiguous
      {{3, 4}, {1, 3}},  // transposed
      {{2, 3}, {6, 2}},  // strided slices
      {{3, 4}, {0, 1}},  // expand
      {{3, 4}, {2, 1}},  // unfold(size 4, step 2)
      {{4, 4}, {1, 1}},  // as_strided onto itself
      {{2, 2}, {3, 2}},  // interleaved without overlap
      {{0, 4}, {0, 1}},  // no element
      {{1, 5}, {0, 1}},  // stride 0 on a dimension of size 1
  };
  for (const auto& c : cases) {
    EXPECT_EQ(may_self_overlap(c.sizes, c.strides), eager_self_overlap(c.sizes, c.strides))
        << "sizes " << at::IntArrayRef(c.sizes) << " strides " << at::IntArrayRef(c.strides);
  }
}

TEST(MaySelfOverlap, IsConservativeForExoticInterleavings) {
  // Elements at 0, 3, 2, 5, 4, 7: all distinct, yet the sorted-stride test cannot tell.
  EXPECT_FALSE(eager_self_overlap({3, 2}, {2, 3}));
  EXPECT_TRUE(may_self_overlap({3, 2}, {2, 3}));
}

TEST(SpanOf, CoversFirstToLastElementInBytes) {
  const at::Tensor storage = at::zeros({64}, at::kFloat);
  for (const auto& t : {storage.as_strided({3, 4}, {1, 3}, 5),
                        storage.as_strided({2, 3}, {10, 2}, 1), storage.narrow(0, 7, 9)}) {
    const at::Tensor indices = addressed(t.sizes(), t.strides(), t.storage_offset());
    const Span span = span_of(t);
    EXPECT_EQ(span.begin, indices.min().item<int64_t>() * 4);
    EXPECT_EQ(span.end, (indices.max().item<int64_t>() + 1) * 4);
  }
}

TEST(ElementsOverlap, AgreesWithEagerWrites) {
  using Pair = std::pair<at::Tensor, at::Tensor>;
  const std::vector<std::function<Pair(const at::Tensor&)>> makes = {
      // interleaved slices: spans meet, elements do not
      [](const at::Tensor& m) {
        const at::Tensor x = m.view(at::kFloat);
        return Pair{x.slice(0, 0, 16, 2), x.slice(0, 1, 16, 2)};
      },
      // overlapping slices
      [](const at::Tensor& m) {
        const at::Tensor x = m.view(at::kFloat);
        return Pair{x.slice(0, 0, 8), x.slice(0, 6, 12)};
      },
      // a row and a column of one matrix: one shared element
      [](const at::Tensor& m) {
        const at::Tensor x = m.view(at::kFloat).narrow(0, 0, 16).view({4, 4});
        return Pair{x.select(0, 1), x.select(1, 2)};
      },
      // the diagonal and an off-diagonal: none shared
      [](const at::Tensor& m) {
        const at::Tensor x = m.view(at::kFloat).narrow(0, 0, 16).view({4, 4});
        return Pair{x.diagonal(), x.diagonal(1)};
      },
      // another dtype over the same bytes: int16 halves of the float elements of the odd slots
      [](const at::Tensor& m) {
        const at::Tensor x = m.view(at::kFloat);
        return Pair{x.slice(0, 1, 16, 2), m.view(at::kShort).slice(0, 0, 32, 4)};
      },
      [](const at::Tensor& m) {
        const at::Tensor x = m.view(at::kFloat);
        return Pair{x.slice(0, 1, 16, 2), m.view(at::kShort).slice(0, 2, 32, 4)};
      },
  };
  for (size_t i = 0; i < makes.size(); ++i) {
    const at::Tensor bytes = at::zeros({256}, at::kByte);
    const auto [a, b] = makes[i](bytes);
    EXPECT_EQ(elements_overlap(a, b), eager_overlap(makes[i])) << "case " << i;
    EXPECT_EQ(spans_and_elements_overlap(a, b), eager_overlap(makes[i])) << "case " << i;
  }
}

TEST(ElementsOverlap, EmptyTensorsOverlapNothing) {
  const at::Tensor x = at::zeros({8});
  EXPECT_FALSE(spans_and_elements_overlap(x.narrow(0, 2, 0), x));
}

TEST(SameGeometry, ComparesItemSizeOffsetSizesAndStrides) {
  const at::Tensor x = at::zeros({4, 4});
  EXPECT_TRUE(same_geometry(x.t(), x.t()));
  EXPECT_FALSE(same_geometry(x.t(), x));
  EXPECT_FALSE(same_geometry(x[1], x[2]));
  EXPECT_FALSE(same_geometry(x.view(at::kInt), x.view(at::kInt).view(at::kShort).narrow(1, 0, 4)));
}

// Whether every storage index `inner` reads is one `outer` reads, eagerly (arange storages).
bool eager_within(const at::Tensor& inner, const at::Tensor& outer) {
  const at::Tensor in = addressed(inner.sizes(), inner.strides(), inner.storage_offset());
  const at::Tensor out = addressed(outer.sizes(), outer.strides(), outer.storage_offset());
  return at::isin(in.flatten(), out.flatten()).all().item<bool>();
}

TEST(ElementsWithin, AgreesWithEagerOnGapsAndSpans) {
  // A strided slice with gaps (b[1:, ::2] of a (3, 2, 4) b) against resizes within its storage.
  const at::Tensor storage = at::zeros({64});
  const at::Tensor slice = storage.as_strided({2, 1, 4}, {8, 8, 1}, 8);
  const std::vector<at::Tensor> candidates{
      storage.as_strided({4}, {1}, 8),         // its first row
      storage.as_strided({6}, {1}, 8),         // into the gap after it
      storage.as_strided({2, 4}, {8, 1}, 8),   // both rows
      storage.as_strided({2, 2}, {8, 2}, 9),   // every other element of both rows
      storage.as_strided({3}, {8}, 8),         // past its last row
      storage.as_strided({1}, {1}, 7),         // the element before it
      storage.as_strided({0}, {1}, 40),        // no element
      storage.as_strided({4, 1}, {1, 1}, 16),  // its second row, another shape
  };
  for (size_t i = 0; i < candidates.size(); ++i) {
    EXPECT_EQ(elements_within(candidates[i], slice), eager_within(candidates[i], slice))
        << "case " << i;
  }
  // A dense outer tensor holds every element of its span.
  EXPECT_TRUE(elements_within(storage.as_strided({3, 2}, {1, 3}, 10), storage.narrow(0, 10, 6)));
  EXPECT_FALSE(elements_within(storage.as_strided({3}, {1}, 20), storage.narrow(0, 10, 11)));
  // Elements of another size are never the same elements.
  EXPECT_FALSE(elements_within(storage.view(at::kDouble).narrow(0, 0, 2), storage));
}

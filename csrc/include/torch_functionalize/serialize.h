// Saving a captured program to a file and reading it back (public API): the program's ops, its
// constants (weights a C++ model's parameters gave it included) and its input guards, in
// LibTorch's pickle format. Python reads the file with torch_functionalize.load_graph.
// See Note [Serialize: a captured graph on disk].
#pragma once

#include <torch_functionalize/functionalize.h>

#include <string>

namespace tfz {

/// Writes `graph` to `path`. Raises if one of its constants has no pickled form (a Generator
/// argument of a random op, for one).
void save(const CapturedGraph& graph, const std::string& path);

/// Reads a graph written by tfz::save; its ops are looked up in this process's dispatcher (custom
/// ops must be registered first). Raises on a file of another format or version.
CapturedGraph load(const std::string& path);

}  // namespace tfz

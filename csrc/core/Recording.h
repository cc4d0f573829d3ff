// Whether the engine's work on inner tensors ends up in a graph: the one question the base
// structures (ViewMeta, FunctionalTensorImpl) ask about recording, without knowing the recorder
// (core/Recorder.h, which defines it) or the graph it builds.
#pragma once

namespace tfz::detail {

/// True when what the engine runs on inner tensors ends up in a graph: a tracer's dispatch mode is
/// set, or a capture is recording. Fast paths that mutate inner values in place are off then.
bool ops_are_recorded();

/// ops_are_recorded(), or any Python dispatch mode (an infra mode too) or Python key set on the
/// thread: a graph may see the call, so it must not write memory the graph does not take.
bool calls_may_be_traced();

/// A Python tracer (make_fx's mode, any dispatch mode or Python key) may see the call: its graph
/// has no input guards, so what it records must hold on any input of the traced sizes.
bool traced_without_guards();

}  // namespace tfz::detail

// The reusable memory of kernel calls (STYLE.md "device buffers").
#pragma once

#include <cstdint>
#include <vector>

#include "core/scratch_arena.h"
#include "kernels/bf16_activations.h"
#include "kernels/q8_activations.h"

namespace woq {

/// The ScratchArena slots of the kernels; each kernel uses only its own.
enum ScratchSlot : int {
  kSlotDotRow = 0,     ///< float_rows: one widened weight row (dot_row's scratch)
  kSlotWidenTile = 1,  ///< float_rows: a tile of widened weight rows (prefill)
  kSlotTileB = 2,      ///< tile kernels: a pass's packed weights (amx, avx512_bf16)
  kSlotTileUnits = 3,  ///< amx int16 tiles: the scale units of a group of rows
  kSlotTileSlots = 4,  ///< amx int16 tiles: where each block sits in the packed weights
  kSlotAttention = 5,  ///< causal_attention: a job's transposed keys, scores and sums
};

/// What matmul and causal_attention reuse from call to call on one ThreadPool:
/// the activations a matmul quantizes (or rounds) once for all its threads,
/// the inputs an act-order matrix gathers, and one ScratchArena per thread
/// (ThreadPool::parallel_for_threads's index). Owned by whoever makes the
/// calls (LlamaModel holds one for its forward passes; a call without one
/// uses a temporary). Calls sharing a Workspace must not run at the same
/// time, as calls sharing a ThreadPool must not. Buffers only grow; drop (or
/// reassign) the Workspace to return the memory.
class Workspace {
 public:
  Q8Activations q8;
  Bf16Activations bf16;
  /// Block-format matrices' activations (formats/kquant.h): m rows of Q8_K or Q8_1 blocks.
  std::vector<std::uint8_t> q8k;
  std::vector<float> gathered;

  /// Makes sure there is an arena for each of `threads` threads (call before a parallel pass).
  void fit(int threads) {
    if (static_cast<int>(arenas_.size()) < threads) arenas_.resize(static_cast<std::size_t>(threads));
  }
  /// Thread `thread`'s arena (thread < the last fit).
  ScratchArena& arena(int thread) { return arenas_[static_cast<std::size_t>(thread)]; }

 private:
  std::vector<ScratchArena> arenas_;
};

}  // namespace woq

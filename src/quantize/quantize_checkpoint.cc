#include "quantize/quantize_checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string_view>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "arch/architecture.h"
#include "core/error.h"
#include "core/half.h"
#include "core/memory.h"
#include "core/mmap_file.h"
#include "formats/format_traits.h"
#include "io/gguf.h"
#include "io/hf_config_writer.h"
#include "io/json_file.h"
#include "io/quantized_checkpoint.h"
#include "io/safetensors_writer.h"
#include "model/checkpoint_check.h"
#include "tokenizer/gguf_vocab.h"

namespace woq {

namespace fs = std::filesystem;

namespace {

// One output tensor: copied from the input, or part `part` of linear
// `linear` of block `layer`.
struct Source {
  const TensorView* copy = nullptr;
  bool to_f32 = false;  ///< copy converted to F32 (a GGUF's ggml-typed or row-permuted tensors)
  std::int64_t layer = -1;
  int linear = 0;
  int part = 0;
  bool lm_head = false;  ///< part `part` of the planned lm_head (layer num_hidden_layers), rounded from `copy`
};

// The integer tensors of linear `prefix` [n, k] in `module`'s layout (GPTQ: qweight, qzeros, scales, g_idx;
// AWQ GEMM: qweight, qzeros, scales).
std::vector<TensorSpec> packed_specs(const QuantizationConfig& module, const std::string& prefix, std::int64_t n,
                                     std::int64_t k) {
  if (module.method == QuantizationConfig::Method::kAwq) {
    const AwqTensors t = awq_layout(module.awq_version, n, k, module.group_size);
    return {{prefix + ".qweight", DType::kI32, t.qweight_shape()},
            {prefix + ".qzeros", DType::kI32, t.qzeros_shape()},
            {prefix + ".scales", DType::kF16, t.scales_shape()}};
  }
  const std::int64_t per_word = 32 / module.bits;
  const std::int64_t groups = module.group_size == -1 ? 1 : (k + module.group_size - 1) / module.group_size;
  return {{prefix + ".qweight", DType::kI32, {(k + per_word - 1) / per_word, n}},
          {prefix + ".qzeros", DType::kI32, {groups, (n + per_word - 1) / per_word}},
          {prefix + ".scales", DType::kF16, {groups, n}},
          {prefix + ".g_idx", DType::kI32, {k}}};
}

template <typename T>
std::vector<std::uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<std::uint8_t> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// The bytes of packed_specs' tensors for `q` (one vector per tensor).
std::vector<std::vector<std::uint8_t>> packed_parts(const QuantizationConfig& module, const QuantMatrix& q,
                                                    GptqZeros zeros, ThreadPool& pool) {
  if (module.method == QuantizationConfig::Method::kAwq) {
    const AwqTensors t = pack_awq(to_int_matrix(q, &pool), module.awq_version, module.group_size, &pool);
    return {bytes_of(t.qweight), bytes_of(t.qzeros), bytes_of(t.scales)};
  }
  const GptqTensors t = pack_gptq(to_int_matrix(q, &pool), zeros, &pool);
  return {bytes_of(t.qweight), bytes_of(t.qzeros), bytes_of(t.scales), bytes_of(t.g_idx)};
}

// Remarks on shapes that GPTQ readers outside woq may not handle.
std::vector<std::string> compatibility_notes(const ModelConfig& c, std::int64_t group_size, int bits) {
  std::vector<std::string> notes;
  const std::int64_t per_word = 32 / bits;
  std::map<std::int64_t, std::string> ks = {{c.hidden_size, "hidden_size"}, {c.intermediate_size, "intermediate_size"}};
  if (c.q_dim() != c.hidden_size) ks[c.q_dim()] = "num_attention_heads * head_dim";
  for (const auto& [k, what] : ks) {
    if (group_size != -1 && k % group_size != 0)
      notes.push_back(fmt::format("K = {} ({}) is not a multiple of group_size {}: the last group is shorter; "
                                  "GPTQ kernels outside woq (exllama, marlin) require K % group_size == 0",
                                  k, what, group_size));
    if (k % 32 != 0)
      notes.push_back(fmt::format("K = {} ({}) is not a multiple of 32: qweight is padded with zeros to {} rows; "
                                  "most GPTQ readers require K % 32 == 0",
                                  k, what, (k + per_word - 1) / per_word));
  }
  for (const std::int64_t n : {c.q_dim(), c.kv_dim(), c.hidden_size, c.intermediate_size})
    if (n % 32 != 0) {
      notes.push_back(fmt::format("N = {} is not a multiple of 32: qzeros are padded with zeros to {} columns; "
                                  "most GPTQ readers require N % 32 == 0",
                                  n, (n + per_word - 1) / per_word));
      break;
    }
  return notes;
}

bool is_weight_file(const fs::path& p) {
  const std::string ext = p.extension().string();
  return ext == ".safetensors" || ext == ".bin" || ext == ".pt" || ext == ".pth" || ext == ".gguf" ||
         p.filename() == "model.safetensors.index.json" || p.filename() == "pytorch_model.bin.index.json" ||
         p.filename() == "config.json";
}

// The name prefix of quantize's temporary directories beside `out`: each is
// PREFIX + "PID-RANDOM" (+ ".old" while publish replaces an existing `out`).
std::string temp_prefix(const fs::path& out) { return fmt::format(".{}.tmp-", out.filename().string()); }

// The PID in `name` when it is one of the temporary directories of `out`
// (its ".old" suffix reported in `old`); nullopt for anything else.
std::optional<pid_t> temp_dir_owner(const fs::path& out, const std::string& name, bool& old) {
  const std::string prefix = temp_prefix(out);
  if (!name.starts_with(prefix)) return std::nullopt;
  std::string_view rest = std::string_view(name).substr(prefix.size());
  old = rest.ends_with(".old");
  if (old) rest.remove_suffix(4);
  std::int64_t pid = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), pid);
  const std::string_view random = rest.substr(static_cast<std::size_t>(end - rest.data()));
  if (ec != std::errc() || pid <= 0 || pid > std::numeric_limits<pid_t>::max() || random.size() != 9 ||
      random[0] != '-' || random.find_first_not_of("0123456789abcdef", 1) != std::string_view::npos)
    return std::nullopt;
  return static_cast<pid_t>(pid);
}

// False when no process `pid` exists (kill(2) refused with EPERM means it does) or it is a zombie (killed and
// not yet reaped by its parent: it holds no lock and writes nothing more).
bool process_alive(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat_file(fmt::format("/proc/{}/stat", pid));
  std::string stat;
  std::getline(stat_file, stat);
  const std::size_t name_end = stat.rfind(')');  // "PID (COMMAND) STATE ..."; COMMAND may hold ')'
  return name_end == std::string::npos || name_end + 2 >= stat.size() || stat[name_end + 2] != 'Z';
}

// An open directory with an exclusive flock(2), or -1 when another process
// holds one (a live quantize writing into it). Other failures (a file system
// without locks) give a descriptor that locks nothing, or -2.
int lock_directory(const fs::path& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -2;
  if (flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    close(fd);
    return -1;
  }
  return fd;
}

// Removes the temporary directories beside `out` that a woq quantize killed
// before it finished left behind: those whose PID no longer runs and whose
// lock nobody holds. A live process's directory is never touched, nor one
// that is or holds `keep` (the input), nor an ".old" copy of the previous
// `out` when `out` itself is missing (the process died between its two
// renames: that copy is the only one). Reports each directory removed or
// kept to `log`.
void remove_stale_temp_dirs(const fs::path& out, const fs::path& keep,
                            const std::function<void(const std::string&)>& log) {
  std::error_code ec;
  std::vector<std::pair<fs::path, pid_t>> stale;
  for (fs::directory_iterator it(out.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
    bool old = false;
    const auto pid = temp_dir_owner(out, it->path().filename().string(), old);
    std::error_code type_ec;
    if (!pid || !it->is_directory(type_ec) || it->is_symlink(type_ec) || process_alive(*pid)) continue;
    const std::string dir = fs::weakly_canonical(it->path(), type_ec).string(), input = keep.string();
    if (input == dir || input.starts_with(dir + "/")) continue;
    if (old && !fs::exists(fs::symlink_status(out, type_ec))) {
      if (log)
        log(fmt::format("kept {}: it holds the previous {}, which woq quantize process {} was replacing when it "
                        "stopped; move it back or remove it",
                        it->path().string(), out.string(), *pid));
      continue;
    }
    stale.emplace_back(it->path(), *pid);
  }
  for (const auto& [dir, pid] : stale) {
    const int fd = lock_directory(dir);
    if (fd == -1) continue;  // in use after all (a process of another PID namespace)
    fs::remove_all(dir, ec);
    if (fd >= 0) close(fd);
    if (log)
      log(ec ? fmt::format("could not remove {}, left by woq quantize process {} (no longer running): {}",
                           dir.string(), pid, ec.message())
             : fmt::format("removed {}, left by woq quantize process {}, which is no longer running", dir.string(),
                           pid));
  }
}

// A fresh directory beside `out` for writing into, named with this
// process's PID and locked (flock) while the object lives, so that
// remove_stale_temp_dirs of another woq quantize leaves it alone.
class WorkDir {
 public:
  explicit WorkDir(const fs::path& out) {
    std::random_device rd;
    for (int attempt = 0; attempt < 100; ++attempt) {
      const fs::path p = out.parent_path() / fmt::format("{}{}-{:08x}", temp_prefix(out), getpid(), rd());
      std::error_code ec;
      if (fs::create_directory(p, ec)) {
        path_ = p;
        fd_ = lock_directory(p);
        return;
      }
      if (ec) fail("{}: cannot create: {}", p.string(), ec.message());
    }
    fail("{}: cannot create a temporary directory beside it", out.string());
  }
  ~WorkDir() {
    if (fd_ >= 0) close(fd_);
  }
  WorkDir(const WorkDir&) = delete;
  WorkDir& operator=(const WorkDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
  int fd_ = -1;
};

// Moves `tmp` to `out`, replacing an existing `out` only when `force`.
void publish(const fs::path& tmp, const fs::path& out, bool force) {
  std::error_code ec;
  fs::path old;
  if (fs::exists(fs::symlink_status(out))) {
    if (!force) fail("{}: already exists (pass --force to replace it)", out.string());
    old = out.parent_path() / (tmp.filename().string() + ".old");
    fs::rename(out, old, ec);
    if (ec) fail("{}: cannot move aside: {}", out.string(), ec.message());
  }
  fs::rename(tmp, out, ec);
  if (ec) {
    if (!old.empty()) fs::rename(old, out);
    fail("{}: cannot rename to {}: {}", tmp.string(), out.string(), ec.message());
  }
  if (!old.empty()) fs::remove_all(old, ec);
}

}  // namespace

void remove_stale_quantize_temps(const std::string& out_path, const std::string& input,
                                 const std::function<void(const std::string&)>& log) {
  std::error_code ec;
  const fs::path out = fs::absolute(fs::path(out_path), ec).lexically_normal();
  if (ec || out.filename().empty() || !fs::is_directory(out.parent_path(), ec)) return;
  // The directories quantize_checkpoint reports again when it runs are left to it (only removals are said here).
  remove_stale_temp_dirs(out, fs::weakly_canonical(fs::path(input), ec), [&log](const std::string& line) {
    if (log && !line.starts_with("kept ")) log(line);
  });
  // gguf_writer's NAME.tmp-PID files (a GGUF output): no lock, so the PID alone says whether one is in use.
  const std::string prefix = out.filename().string() + ".tmp-";
  for (fs::directory_iterator it(out.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code type_ec;
    if (!name.starts_with(prefix) || !it->is_regular_file(type_ec) || it->is_symlink(type_ec)) continue;
    const std::string_view digits = std::string_view(name).substr(prefix.size());
    std::int64_t pid = 0;
    const auto [end_digits, parse_ec] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
    if (parse_ec != std::errc() || end_digits != digits.data() + digits.size() || pid <= 0 ||
        pid > std::numeric_limits<pid_t>::max() || digits.front() == '0' || process_alive(static_cast<pid_t>(pid)))
      continue;
    fs::remove(it->path(), type_ec);
    if (log)
      log(type_ec ? fmt::format("could not remove {}, left by woq quantize process {} (no longer running): {}",
                                it->path().string(), pid, type_ec.message())
                  : fmt::format("removed {}, left by woq quantize process {}, which is no longer running",
                                it->path().string(), pid));
  }
}

BlockQuantizer rtn_quantizer(const TensorStore& store, const ModelConfig& config, const QuantSpec& base,
                             ThreadPool& pool, std::shared_ptr<const QuantPlan> plan) {
  return [&store, config, base, &pool, plan](std::int64_t layer) {
    std::vector<QuantMatrix> out;
    for (const LinearSpec& linear : kBlockLinears) {
      const TensorView& t = store.get(linear_tensor(layer, linear.role));
      const auto [n, k] = block_linear_shape(config, linear.role);
      require_shape(t, {n, k}, fmt::format("from {}", shape_source(t)));
      require_float_dtype(t);
      const std::int64_t cols = k;
      const QuantSpec& spec = plan ? plan->linear(layer, linear.role) : base;
      try {
        out.push_back(quantize_matrix([&t, cols](std::int64_t r, float* row) { tensor_to_f32(t, row, r * cols, cols); },
                                      n, k, spec, &pool));
        release_pages(t.bytes);  // keeps the input's resident pages to about one tensor
      } catch (const Error& e) {
        fail("{}: tensor '{}': {}", t.file, t.name, e.what());
      }
    }
    return QuantizedBlock{std::move(out), {}};
  };
}

void require_writable_architecture(const std::string& input, const ModelConfig& c) {
  if (find_architecture(c.architecture)->fused_projections)
    fail("{}: {} stores q/k/v and gate/up fused (qkv_proj, gate_up_proj); woq runs it, but writes no GPTQ or GGUF "
         "file of it (they would need the fused layout)", input, c.architecture);
}

namespace {

// Checks where out_dir may go (neither it nor the input inside the other,
// its parent a directory) and removes stale temporaries; returns its
// absolute path.
fs::path prepare_output_dir(const std::string& in_dir, const std::string& out_dir, const QuantizeOptions& options) {
  const fs::path in = fs::path(in_dir);
  if (out_dir.empty()) fail("the output directory name is empty");
  const fs::path out = fs::absolute(fs::path(out_dir)).lexically_normal();
  if (out.filename().empty()) fail("{}: not a directory name", out_dir);
  std::error_code ec;
  if (fs::exists(fs::symlink_status(out)) && !options.force)
    fail("{}: already exists (pass --force to replace it)", out_dir);
  // Neither may contain the other: replacing OUT must never touch IN.
  const fs::path in_real = fs::weakly_canonical(in, ec);
  const fs::path out_real = fs::weakly_canonical(out, ec);
  const auto within = [](const fs::path& inner, const fs::path& outer) {
    const std::string a = inner.string(), b = outer.string();
    return a == b || (a.size() > b.size() && a.compare(0, b.size(), b) == 0 && (b.back() == '/' || a[b.size()] == '/'));
  };
  if (within(in_real, out_real))
    fail("{}: the output directory is or contains the input directory {}", out_dir, in_dir);
  if (within(out_real, in_real)) fail("{}: the output directory is inside the input directory {}", out_dir, in_dir);
  if (is_gguf_path(in_dir))  // every part of a split set, not only the first
    for (const std::string& part : gguf_split_paths(in_dir))
      if (within(fs::weakly_canonical(part, ec), out_real))
        fail("{}: the output would replace {}, a part of the input", out_dir, part);
  if (!fs::exists(out.parent_path())) fail("{}: parent directory does not exist", out_dir);
  if (!fs::is_directory(out.parent_path())) fail("{}: parent {} is not a directory", out_dir, out.parent_path().string());
  remove_stale_temp_dirs(out, in_real, options.progress);
  return out;
}

// The input's config.json; a GGUF has none: it is written from the GGUF's
// metadata, in the embeddings' float type.
nlohmann::ordered_json input_config_json(const std::string& in_dir, const TensorStore& store,
                                         const ModelConfig& config) {
  if (!is_gguf_path(in_dir))
    return nlohmann::ordered_json::parse(read_json_file((fs::path(in_dir) / "config.json").string()).dump());
  const DType embed = store.get(std::string(kEmbedTokens.hf)).dtype;
  try {
    return hf_config_json(config, embed == DType::kF32 ? "float32" : embed == DType::kBF16 ? "bfloat16" : "float16");
  } catch (const Error& e) {
    fail("{}: no GPTQ checkpoint can be written from it: {}", in_dir, e.what());
  }
}

// The safetensors dtype of a float format.
DType float_dtype(LowBit type) {
  switch (type) {
    case LowBit::kFp32: return DType::kF32;
    case LowBit::kFp16: return DType::kF16;
    case LowBit::kBf16: return DType::kBF16;
    default: fail("internal: {} is not a float format", low_bit_name(type));
  }
}

// `name` (a module name: letters, digits, '.' and '_') as a regex matching it literally.
std::string literal_pattern(const std::string& name) {
  std::string out;
  for (const char c : name) {
    if (c == '.') out += '\\';
    out += c;
  }
  return out;
}

// quantization_config of the output; a group longer than every K is per channel: the config says -1.
QuantizationConfig output_quantization_config(const QuantizeOptions& options, const ModelConfig& config) {
  if (options.checkpoint == QuantizationConfig::Method::kAwq) {
    if (!options.plan) fail("internal: an AWQ checkpoint is written from awq_plan's plan");
    return awq_plan_config(*options.plan, config);
  }
  if (options.plan) return gptq_plan_config(*options.plan, config, options.zeros, options.desc_act);
  QuantizationConfig qc;
  const FormatTraits& format = format_traits(options.spec.type);
  qc.bits = format.value_bits;
  const std::int64_t max_k = std::max({config.hidden_size, config.intermediate_size, config.q_dim()});
  qc.group_size = options.spec.group_size >= max_k ? -1 : options.spec.group_size;
  qc.sym = format.fixed_zero >= 0;
  qc.desc_act = options.desc_act;
  qc.zeros = options.zeros;
  return qc;
}

// The output's tensors in order (embeddings, then block by block, then
// everything else) and where each comes from.
struct TensorPlan {
  std::vector<TensorSpec> specs;
  std::vector<Source> sources;
};

TensorPlan plan_tensors(const TensorStore& store, const ModelConfig& config, const QuantizationConfig& qc,
                        const QuantizeOptions& options, QuantizeReport& report) {
  TensorPlan plan;
  std::vector<std::string> names = store.names();
  std::set<std::string> converted_types;  // ggml types of copied tensors, dequantized to F32
  std::set<std::string> linear_types;     // ggml types of the linear layers, quantized again
  auto add_copy = [&](const std::string& name, std::int64_t layer) {
    const TensorView& t = store.get(name);
    // safetensors holds float types in HF row order: a GGUF's other types and permuted rows become F32 (exact).
    const bool to_f32 = t.dtype == DType::kGgml || t.row_order != nullptr;
    if (t.dtype == DType::kGgml) converted_types.insert(std::string(t.type_name()));
    plan.specs.push_back({name, to_f32 ? DType::kF32 : t.dtype, t.shape});
    plan.sources.push_back({&t, to_f32, layer});
    report.bytes_before += t.bytes.size();
  };
  std::vector<bool> used(names.size(), false);
  auto take = [&](const std::string& prefix, std::int64_t layer) {
    for (std::size_t i = 0; i < names.size(); ++i)
      if (!used[i] && names[i].rfind(prefix, 0) == 0) {
        used[i] = true;
        bool linear = false;
        for (const LinearSpec& spec : kBlockLinears)
          if (prefix.starts_with("model.layers.") && names[i] == prefix + std::string(spec.module) + ".weight")
            linear = true;
        if (!linear) add_copy(names[i], layer);
      }
  };
  take(std::string(kEmbedTokens.hf.substr(0, kEmbedTokens.hf.rfind('.') + 1)), -1);  // "model.embed_tokens."
  for (std::int64_t l = 0; l < config.num_hidden_layers; ++l) {
    take(layer_tensor(l, ""), l);
    for (const LinearSpec& spec : kBlockLinears) {
      const int j = static_cast<int>(spec.role);
      const std::string name = layer_tensor(l, spec.module);
      const TensorView& t = store.get(name + ".weight");
      report.bytes_before += t.bytes.size();
      if (t.dtype == DType::kGgml) linear_types.insert(std::string(t.type_name()));
      const auto [n, k] = block_linear_shape(config, spec.role);
      const std::optional<QuantizationConfig> module = qc.for_module(name);
      if (!module) {  // kept in floating point: the plan's float type
        plan.specs.push_back({name + ".weight", float_dtype(options.plan->linear(l, spec.role).type), {n, k}});
        plan.sources.push_back({nullptr, false, l, j, 0});
        continue;
      }
      const auto parts = packed_specs(*module, name, n, k);
      for (std::size_t p = 0; p < parts.size(); ++p) {
        plan.specs.push_back(parts[p]);
        plan.sources.push_back({nullptr, false, l, j, static_cast<int>(p)});
      }
    }
  }
  // A planned lm_head, after the blocks: GPTQ integers (qc.lm_head) or its float type.
  if (const std::optional<QuantSpec> head = options.plan ? options.plan->lm_head() : std::nullopt) {
    const std::string name(kLmHead.hf);
    const TensorView& t = store.get(name);
    for (std::size_t i = 0; i < names.size(); ++i) used[i] = used[i] || names[i] == name;
    report.bytes_before += t.bytes.size();
    const std::vector<TensorSpec> parts =
        qc.lm_head ? packed_specs(*qc.for_module(std::string(kLmHeadModule)), std::string(kLmHeadModule),
                                  config.vocab_size, config.hidden_size)
                   : std::vector<TensorSpec>{{name, float_dtype(head->type), {config.vocab_size, config.hidden_size}}};
    for (std::size_t p = 0; p < parts.size(); ++p) {
      plan.specs.push_back(parts[p]);
      plan.sources.push_back({&t, false, config.num_hidden_layers, 0, static_cast<int>(p), true});
    }
  }
  take("", -1);
  for (const auto& s : plan.specs) report.bytes_after += s.bytes();
  if (!converted_types.empty())
    report.notes.push_back(fmt::format("the GGUF's {} tensors outside the linear layers are written as F32 "
                                       "(dequantized exactly; safetensors has no ggml block types)",
                                       fmt::join(converted_types, ", ")));
  if (!linear_types.empty())
    report.notes.push_back(fmt::format("the GGUF's {} linear layers are dequantized and quantized again as {} "
                                       "(a Q4_0 block becomes the same integers and scale in sym_int4 g32 full range)",
                                       fmt::join(linear_types, ", "), describe(options.spec)));
  return plan;
}

// fp32 `values` into `dst` as `spec`'s dtype (F32, F16 or BF16, rounded to nearest even).
void write_float(const std::vector<float>& values, const TensorSpec& spec, std::span<std::uint8_t> dst) {
  const std::size_t width = spec.dtype == DType::kF32 ? 4 : 2;
  if (values.size() * width != dst.size() || (width == 2 && spec.dtype != DType::kF16 && spec.dtype != DType::kBF16))
    fail("internal: {} values for tensor '{}' of {} bytes", values.size(), spec.name, dst.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (width == 4) {
      std::memcpy(dst.data() + 4 * i, &values[i], 4);
    } else {
      const std::uint16_t h = spec.dtype == DType::kF16 ? fp32_to_fp16(values[i]) : fp32_to_bf16(values[i]);
      std::memcpy(dst.data() + 2 * i, &h, 2);
    }
  }
}

// The writer's TensorFiller: copies tensors, and quantizes each block (one
// at a time) when its first tensor is written, reporting progress.
class BlockFiller {
 public:
  BlockFiller(const TensorPlan& plan, const ModelConfig& config, const QuantizationConfig& qc,
              const QuantizeOptions& options, const BlockQuantizer& quantize_block, QuantizeReport& report,
              ThreadPool& pool)
      : plan_(plan), config_(config), qc_(qc), options_(options), quantize_block_(quantize_block), report_(report),
        pool_(pool) {}

  void operator()(std::size_t i, std::span<std::uint8_t> dst) {
    const Source& s = plan_.sources[i];
    if (s.lm_head) {
      if (s.layer != current_) quantize_lm_head(*s.copy, s.layer);
    } else if (s.layer >= 0 && s.layer != current_) {
      quantize(s.layer);  // a block's first tensor: quantize it
    }
    if (s.copy != nullptr && !s.lm_head) {
      copy(s, plan_.specs[i], dst);
      return;
    }
    const std::vector<std::uint8_t>& part = packed_[static_cast<std::size_t>(s.linear)][static_cast<std::size_t>(s.part)];
    if (part.size() != dst.size()) fail("internal: part {} of linear {} holds {} bytes, not {}", s.part, s.linear,
                                        part.size(), dst.size());
    std::memcpy(dst.data(), part.data(), dst.size());
  }

 private:
  // A tensor the output copies: as a block's quantizer replaced it, converted to F32, or byte for byte.
  void copy(const Source& s, const TensorSpec& spec, std::span<std::uint8_t> dst) {
    // By the output's (Hugging Face) name: a GGUF input's tensors have llama.cpp's names.
    if (const auto it = replaced_.find(spec.name); s.layer >= 0 && it != replaced_.end()) {
      write_float(it->second, spec, dst);
      return;
    }
    if (s.to_f32) {
      tensor_to_f32(*s.copy, reinterpret_cast<float*>(dst.data()), 0, -1);
    } else {
      std::memcpy(dst.data(), s.copy->bytes.data(), dst.size());
    }
    release_pages(s.copy->bytes);
  }

  // The planned lm_head (read from `head`) rounded to nearest in its format, as loading with the plan does:
  // its GPTQ parts (or its float bytes) in packed_[0]; `layer` marks it done.
  void quantize_lm_head(const TensorView& head, std::int64_t layer) {
    const QuantSpec spec = *options_.plan->lm_head();
    const std::int64_t n = config_.vocab_size, k = config_.hidden_size;
    require_shape(head, {n, k}, fmt::format("from {}", shape_source(head)));
    require_float_dtype(head);
    QuantMatrix q;
    try {
      q = quantize_matrix([&head, k](std::int64_t r, float* row) { tensor_to_f32(head, row, r * k, k); }, n, k, spec,
                          &pool_);
    } catch (const Error& e) {
      fail("{}: tensor '{}': {}", head.file, head.name, e.what());
    }
    release_pages(head.bytes);
    packed_.clear();
    if (qc_.lm_head)
      packed_.push_back(packed_parts(*qc_.for_module(std::string(kLmHeadModule)), q, options_.zeros, pool_));
    else
      packed_.push_back({std::move(q.data)});
    report_.matrices++;
    current_ = layer;
  }

  void quantize(std::int64_t layer) {
    packed_.clear();
    const auto quantize_start = std::chrono::steady_clock::now();
    QuantizedBlock quantized = quantize_block_(layer);
    std::vector<QuantMatrix>& block = quantized.linears;
    replaced_ = std::move(quantized.replaced);
    const auto pack_start = std::chrono::steady_clock::now();
    if (block.size() != kBlockLinears.size())
      fail("internal: quantizer returned {} matrices for layer {}", block.size(), layer);
    for (const auto& [name, values] : replaced_) {
      const bool written = std::any_of(plan_.specs.begin(), plan_.specs.end(), [&](const TensorSpec& t) {
        return t.name == name && t.dtype != DType::kI32;
      });
      if (!name.starts_with(layer_tensor(layer, "")) || !written)
        fail("internal: the quantizer of layer {} replaced '{}', which the output does not copy", layer, name);
    }
    for (int j = 0; j < static_cast<int>(kBlockLinears.size()); ++j) {
      QuantMatrix& q = block[static_cast<std::size_t>(j)];
      const std::string module = layer_tensor(layer, kBlockLinears[static_cast<std::size_t>(j)].module);
      const std::optional<QuantizationConfig> c = qc_.for_module(module);
      if (!c || !is_quantized(q.type)) {  // a module kept in floating point: [N, K] row-major, as stored
        if (c || q.interleave != 1) fail("internal: {} is {} where the config says {}", module, low_bit_name(q.type),
                                         c ? "integers" : "float");
        packed_.push_back({std::move(q.data)});
        report_.matrices++;
        report_.kept_float++;
        continue;
      }
      try {
        packed_.push_back(packed_parts(*c, q, options_.zeros, pool_));
      } catch (const Error& e) {
        fail("{}: {}", module, e.what());
      }
      report_.matrices++;
    }
    current_ = layer;
    const auto now = std::chrono::steady_clock::now();
    const double elapsed = std::chrono::duration<double>(now - first_block_).count();
    const std::int64_t left = config_.num_hidden_layers - layer - 1;
    const auto seconds = [](auto d) { return std::chrono::duration<double>(d).count(); };
    // Writing: the previous block's tensors, from its end to this one's start, and packing this one.
    if (options_.progress)
      options_.progress(fmt::format("layer {}/{} quantized in {:.2f} s, writing {:.2f} s (ETA {:.0f} s, RSS {:.2f} GiB)",
                                    layer + 1, config_.num_hidden_layers, seconds(now - block_start_),
                                    seconds(quantize_start - block_start_) + seconds(now - pack_start),
                                    elapsed / static_cast<double>(layer + 1) * static_cast<double>(left),
                                    static_cast<double>(current_rss_bytes()) / (1u << 30)));
    if (options_.layer_progress) options_.layer_progress(layer + 1, config_.num_hidden_layers);
    block_start_ = now;
  }

  const TensorPlan& plan_;
  const ModelConfig& config_;
  const QuantizationConfig& qc_;
  const QuantizeOptions& options_;
  const BlockQuantizer& quantize_block_;
  QuantizeReport& report_;
  ThreadPool& pool_;
  std::int64_t current_ = -1;
  std::vector<std::vector<std::vector<std::uint8_t>>> packed_;  ///< per linear of the block: its tensors' bytes
  std::map<std::string, std::vector<float>> replaced_;           ///< the block's float tensors the quantizer changed
  std::chrono::steady_clock::time_point block_start_ = std::chrono::steady_clock::now();
  const std::chrono::steady_clock::time_point first_block_ = block_start_;
};

// config.json's quantization_config, with woq's notes in its meta.
nlohmann::ordered_json output_quantization_json(const QuantizationConfig& qc, const QuantizeOptions& options,
                                                const QuantizeReport& report) {
  nlohmann::ordered_json q = qc.method == QuantizationConfig::Method::kAwq
                                 ? awq_config_json(qc)
                                 : gptq_config_json(qc, options.damp_percent, options.static_groups,
                                                    options.true_sequential);
  q["meta"] = {{"quantizer", {"woq 0.1.0"}},
               {"woq_method", options.method},
               {"woq_low_bit", low_bit_name(options.spec.type)},
               {"woq_notes", report.notes}};
  if (!options.method_settings.empty()) q["meta"]["woq_settings"] = options.method_settings;
  if (options.plan && qc.method == QuantizationConfig::Method::kGptq)
    q["meta"]["woq_plan"] = options.plan->source.empty() ? std::string("(in memory)")
                                                          : fs::path(options.plan->source).filename().string();
  if (options.spec.type == LowBit::kSymInt4) {
    q["meta"]["woq_int4_range"] = int4_range_name(options.spec.int4_range);
    if (options.spec.int4_range == Int4Range::kFull)
      q["meta"]["woq_scales"] =
          "signed: the Q4_0 full-range rule maps each group's largest-magnitude value to -8, so a group whose "
          "largest magnitude is positive has a negative scale; (q - zero) * scale is exact either way";
  }
  return q;
}

}  // namespace

QuantizationConfig gptq_plan_config(const QuantPlan& plan, const ModelConfig& c, GptqZeros zeros, bool desc_act) {
  const std::string where = plan.source.empty() ? std::string("plan") : plan.source;
  if (plan.embeddings())
    fail("{}: model.embed_tokens: a GPTQ checkpoint keeps the embeddings in float (GPTQModel and vLLM quantize "
         "linear layers only); leave model.embed_tokens out of the plan{}", where,
         c.tie_word_embeddings ? "" : ", or write it as GGUF (-o FILE.gguf)");
  if (plan.lm_head() && c.tie_word_embeddings)
    fail("{}: lm_head: this model ties lm_head to its embeddings (tie_word_embeddings); a GPTQ checkpoint "
         "quantizes an lm_head of its own only: remove lm_head from the plan", where);
  const std::int64_t max_k = std::max({c.hidden_size, c.intermediate_size, c.q_dim()});
  // bits, group_size (-1 for a group as long as K), sym of an integer format; nullopt for a float one.
  const auto gptq_of = [&](const QuantSpec& spec, const std::string& module, std::int64_t k) {
    struct Gptq { int bits; std::int64_t group_size; bool sym; };
    if (is_float_format(spec.type)) return std::optional<Gptq>();
    if (!is_quantized(spec.type))
      fail("{}: {} is {}: a GPTQ checkpoint holds sym_int4, asym_int4, sym_int8 or float layers; write this plan as "
           "GGUF (-o FILE.gguf)", where, module, spec_name(spec));
    const FormatTraits& f = format_traits(spec.type);
    return std::optional<Gptq>(Gptq{f.value_bits, spec.group_size == -1 || spec.group_size >= k ? -1 : spec.group_size,
                                     f.fixed_zero >= 0});
  };
  const auto base = gptq_of(plan.base, "base", max_k);
  if (!base) fail("{}: base is {}: a GPTQ checkpoint's base format is an integer one", where, spec_name(plan.base));
  QuantizationConfig qc;
  qc.bits = base->bits;
  qc.group_size = base->group_size;
  qc.sym = base->sym;
  qc.desc_act = desc_act;
  qc.zeros = zeros;
  // The fields of a module's rule: those in which its format `g` differs from the base's at its K (a group as
  // long as K is per channel); none when it is the base's format.
  const auto differences = [&](const auto& g, std::int64_t k) {
    const auto b = *gptq_of(plan.base, "base", k);
    DynamicRule rule;
    if (g.bits != b.bits) rule.bits = g.bits;
    if (g.group_size != b.group_size) rule.group_size = g.group_size;
    if (g.sym != b.sym) rule.sym = g.sym;
    return rule;
  };
  // The linears vLLM fuses (qkv_proj, gate_up_proj) get one rule when they share a format, so that vLLM's fused
  // module matches it too; otherwise one rule per module.
  struct Fused { std::vector<LinearRole> roles; const char* pattern; };
  const std::vector<Fused> groups = {{{LinearRole::kQ, LinearRole::kK, LinearRole::kV}, "self_attn\\.(q|k|v|qkv)_proj$"},
                                     {{LinearRole::kO}, nullptr},
                                     {{LinearRole::kGate, LinearRole::kUp}, "mlp\\.(gate|up|gate_up)_proj$"},
                                     {{LinearRole::kDown}, nullptr}};
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (const Fused& group : groups) {
      std::vector<std::pair<std::string, DynamicRule>> rules;  // per module: its pattern and rule
      for (const LinearRole role : group.roles) {
        const std::string module = plan_module(l, role);
        const std::int64_t k = block_linear_shape(c, role).second;
        const auto g = gptq_of(plan.linear(l, role), module, k);
        DynamicRule rule = g ? differences(*g, k) : DynamicRule{};
        rule.skip = !g;
        const bool base_format = g && !rule.bits && !rule.group_size && !rule.sym;
        rules.emplace_back(base_format ? std::string() : literal_pattern(module) + "$", rule);  // "": no rule
      }
      const auto same = [&](const DynamicRule& a, const DynamicRule& b) {
        return a.skip == b.skip && a.bits == b.bits && a.group_size == b.group_size && a.sym == b.sym;
      };
      const bool shared = group.pattern != nullptr && !rules.front().first.empty() &&
                          std::all_of(rules.begin(), rules.end(), [&](const auto& r) { return same(r.second, rules.front().second); });
      if (shared) rules = {{literal_pattern(layer_tensor(l, "")) + group.pattern, rules.front().second}};
      for (auto& [pattern, rule] : rules) {
        if (pattern.empty()) continue;
        rule.key = (rule.skip ? "-:" : "+:") + pattern;
        rule.regex = std::make_shared<const Regex>(pattern, where);
        qc.dynamic.push_back(std::move(rule));
      }
    }
  // A planned integer lm_head: `lm_head: true` (GPTQModel's QuantizeConfig.lm_head, which vLLM reads), with a
  // rule when its format is not the base's; a float one is written in its float type and lm_head stays false.
  if (const std::optional<QuantSpec> head = plan.lm_head())
    if (const auto g = gptq_of(*head, std::string(kLmHeadModule), c.hidden_size)) {
      qc.lm_head = true;
      DynamicRule rule = differences(*g, c.hidden_size);
      if (rule.bits || rule.group_size || rule.sym) {
        const std::string pattern = literal_pattern(std::string(kLmHeadModule)) + "$";
        rule.key = "+:" + pattern;
        rule.regex = std::make_shared<const Regex>(pattern, where);
        qc.dynamic.push_back(std::move(rule));
      }
    }
  return qc;
}

void require_float_checkpoint(const std::string& in_dir) {
  if (const auto q = read_quantization_config(in_dir))
    fail("{}: already quantized ({}); woq quantize needs a floating-point checkpoint", in_dir, q->describe());
}

QuantPlan awq_plan(const QuantSpec& spec, const ModelConfig& c, LowBit keep) {
  if (spec.type != LowBit::kAsymInt4 && spec.type != LowBit::kSymInt4)
    fail("an AWQ checkpoint holds 4-bit weights with zero points: asym_int4 (AWQ's own) or sym_int4 (zero 8), not {}",
         low_bit_name(spec.type));
  if (spec.group_size <= 0)
    fail("an AWQ checkpoint needs a group size (AutoAWQ packs K / group_size groups), not {}; AWQ's usual is 128",
         spec.group_size);
  QuantPlan plan;
  plan.base = spec;
  plan.source = "AWQ layout";
  std::string why;
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (const LinearSpec& linear : kBlockLinears) {
      const auto [n, k] = block_linear_shape(c, linear.role);
      try {
        awq_layout(AwqVersion::kGemm, n, k, spec.group_size);
      } catch (const Error& e) {
        plan.tensors[plan_module(l, linear.role)] = {keep};
        why = e.what();
      }
    }
  if (plan.tensors.size() == static_cast<std::size_t>(c.num_hidden_layers) * kBlockLinears.size())
    fail("no linear layer fits AWQ's packing at group_size {} ({}): every one would stay float; choose a group size "
         "that divides K (hidden_size {}, intermediate_size {})", spec.group_size, why, c.hidden_size,
         c.intermediate_size);
  return plan;
}

QuantizationConfig awq_plan_config(const QuantPlan& plan, const ModelConfig& c) {
  QuantizationConfig qc;
  qc.method = QuantizationConfig::Method::kAwq;
  qc.awq_version = AwqVersion::kGemm;
  qc.bits = 4;
  qc.sym = false;
  qc.group_size = plan.base.group_size;
  // Full module names (which match only themselves); where vLLM fuses q/k/v or gate/up and all of them stay
  // float, q's and gate's entry is cut to also match the fused qkv_proj / gate_up_proj ("...self_attn.q",
  // "...mlp.gate": transformers and vLLM match by substring).
  const auto is_float = [&](std::int64_t l, LinearRole r) { return !is_quantized(plan.linear(l, r).type); };
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (const LinearSpec& linear : kBlockLinears) {
      if (!is_float(l, linear.role)) continue;
      std::string name = plan_module(l, linear.role);
      if (linear.role == LinearRole::kQ && is_float(l, LinearRole::kK) && is_float(l, LinearRole::kV))
        name = layer_tensor(l, "self_attn.q");
      if (linear.role == LinearRole::kGate && is_float(l, LinearRole::kUp)) name = layer_tensor(l, "mlp.gate");
      qc.not_converted.push_back(name);
    }
  return qc;
}

QuantizeReport quantize_checkpoint(const std::string& in_dir, const std::string& out_dir,
                                   const QuantizeOptions& options, ThreadPool& pool, const BlockQuantizer& quantize) {
  const auto start = std::chrono::steady_clock::now();
  if (!is_quantized(options.spec.type))
    fail("woq quantize writes integer formats (sym_int4, asym_int4, sym_int8), not {}",
         low_bit_name(options.spec.type));
  validate(options.spec);
  const fs::path out = prepare_output_dir(in_dir, out_dir, options);
  const bool from_gguf = is_gguf_path(in_dir);

  const ModelConfig config = read_model_config(in_dir);
  require_writable_architecture(in_dir, config);
  require_float_checkpoint(in_dir);
  const TensorStore store = TensorStore::open(in_dir);
  validate_checkpoint(store, config, false);  // what loading the output would refuse, before writing it
  nlohmann::ordered_json config_json = input_config_json(in_dir, store, config);
  if (options.plan) options.plan->check_layers(config.num_hidden_layers);
  const BlockQuantizer rtn = quantize ? nullptr : rtn_quantizer(store, config, options.spec, pool, options.plan);
  const BlockQuantizer& quantize_block = quantize ? quantize : rtn;

  const QuantizationConfig qc = output_quantization_config(options, config);
  QuantizeReport report;
  if (qc.method == QuantizationConfig::Method::kAwq) {
    if (!qc.not_converted.empty())
      report.notes.push_back(fmt::format(
          "{} of {} linear layers kept in float (modules_to_not_convert): AWQ's packing needs N % 8 == 0 and "
          "K % group_size == 0 ({}{})", qc.not_converted.size(), config.num_hidden_layers * kBlockLinears.size(),
          fmt::join(qc.not_converted.begin(), qc.not_converted.begin() + std::min<std::size_t>(3, qc.not_converted.size()), ", "),
          qc.not_converted.size() > 3 ? ", ..." : ""));
  } else {
    report.notes = compatibility_notes(config, qc.group_size, qc.bits);
    if (options.plan && options.plan->activations)
      report.notes.push_back(fmt::format("the plan's activations ({}) are not stored in a GPTQ checkpoint: load it with "
                                         "--activations {} to run it as planned",
                                         activations_name(*options.plan->activations),
                                         activations_name(*options.plan->activations)));
  }
  const TensorPlan plan = plan_tensors(store, config, qc, options, report);
  if (qc.lm_head && options.method != "rtn")
    report.notes.push_back(fmt::format("lm_head is rounded to nearest in the plan's {} ({} fits the decoder blocks' "
                                       "linears; the plan's lm_head was measured rounded to nearest)",
                                       spec_name(*options.plan->lm_head()), options.method));
  BlockFiller filler(plan, config, qc, options, quantize_block, report, pool);
  const TensorFiller fill = [&](std::size_t i, std::span<std::uint8_t> dst) { filler(i, dst); };

  const WorkDir work(out);
  const fs::path& tmp = work.path();
  try {
    if (from_gguf) {
      // The GGUF's tokenizer, chat template and BOS/EOS as the Hugging Face files: first, so that a vocabulary
      // they cannot hold fails before the tensors are written.
      write_hf_tokenizer(GgufFile(gguf_split_paths(in_dir).front()), tmp.string());
      write_json_file((tmp / "generation_config.json").string(), hf_generation_config_json(config));
    }
    write_checkpoint_tensors(tmp.string(), plan.specs, fill, options.max_shard_bytes);
    config_json["quantization_config"] = output_quantization_json(qc, options, report);
    write_json_file((tmp / "config.json").string(), config_json);
    if (!from_gguf) {
      for (const auto& entry : fs::directory_iterator(fs::path(in_dir)))
        if (entry.is_regular_file() && !is_weight_file(entry.path()))
          fs::copy_file(entry.path(), tmp / entry.path().filename());
    }
    publish(tmp, out, options.force);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace woq

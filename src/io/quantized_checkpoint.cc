#include "io/quantized_checkpoint.h"

#include <cmath>
#include <algorithm>
#include <cctype>
#include <ctime>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/half.h"
#include "core/mmap_file.h"
#include "core/utf8.h"
#include "io/gguf.h"
#include "io/json_file.h"

namespace woq {

namespace {

int read_bits(const JsonFields& f, const std::string& key) {
  const std::int64_t bits = f.integer(key);
  if (bits != 4 && bits != 8)
    f.field_error(key, fmt::format("is {}: woq supports 4- and 8-bit weights only", bits));
  return static_cast<int>(bits);
}

std::int64_t read_group_size(const JsonFields& f, const std::string& key) {
  const std::int64_t g = f.integer(key);
  if (g != -1 && g <= 0) f.field_error(key, fmt::format("must be -1 (per channel) or positive, got {}", g));
  return g;
}

// Bounds on `dynamic`: a rule names modules (tens of bytes), and a model has at most a few thousand of them.
constexpr std::size_t kMaxRuleBytes = 1024, kMaxRules = 16384;

// GPTQModel's dynamic rules, in the file's order (`rules`: the object as an ordered_json).
std::vector<DynamicRule> dynamic_rules(const nlohmann::ordered_json& rules, const std::string& where) {
  if (!rules.is_object()) fail("{}.dynamic: must be an object of regex -> overrides, got {}", where, rules.type_name());
  // Fields that only say how the module was quantized: loading needs none of them.
  static const std::vector<std::string> kQuantizingOnly = {"damp_percent", "damp_auto_increment", "static_groups",
                                                           "true_sequential", "mse", "v2", "v2_alpha",
                                                           "act_group_aware", "fail_safe"};
  if (rules.size() > kMaxRules) fail("{}.dynamic: {} rules; woq reads at most {}", where, rules.size(), kMaxRules);
  std::vector<DynamicRule> out;
  for (const auto& [key, value] : rules.items()) {
    const std::string field = fmt::format("{}.dynamic['{}']", where, printable(key));
    DynamicRule rule;
    rule.key = key;
    rule.skip = key.starts_with("-:");
    const std::string pattern = key.starts_with("-:") || key.starts_with("+:") ? key.substr(2) : key;
    if (pattern.size() > kMaxRuleBytes)
      fail("{}: the pattern has {} bytes; woq reads rules of at most {}", field, pattern.size(), kMaxRuleBytes);
    try {
      rule.regex = std::make_shared<const Regex>(pattern, field);
    } catch (const Error& e) {
      fail("{}: {}", field, e.what());
    }
    if (!value.is_object()) fail("{}: must be an object of overrides, got {}", field, value.type_name());
    const JsonFields f(nlohmann::json::parse(value.dump()), field);
    for (const auto& [name, v] : value.items()) {
      if (v.is_null()) f.field_error(name, "is null: give a value, or leave the field out");
      if (name == "bits") {
        rule.bits = read_bits(f, name);
      } else if (name == "group_size") {
        rule.group_size = read_group_size(f, name);
      } else if (name == "sym") {
        rule.sym = f.boolean(name, true);
      } else if (name == "desc_act") {
        rule.desc_act = f.boolean(name, false);
      } else if (std::find(kQuantizingOnly.begin(), kQuantizingOnly.end(), name) == kQuantizingOnly.end()) {
        f.field_error(name, "is not a per-module field woq can honour (bits, group_size, sym, desc_act)");
      }
    }
    out.push_back(std::move(rule));
  }
  return out;
}

// How a checkpoint was made, as far as its quantization_config says (for labels only): meta's quantizer (AutoGPTQ,
// GPTQModel and woq write it) and woq_method, and damp_percent for GPTQ.
std::string provenance_of(const nlohmann::json& j) {
  // Provenance, for labels only: fields of unexpected types are skipped, never an error; strings are cut to
  // 64 bytes and control characters (newlines, escapes that would reach a terminal) become '?' (printable_text).
  std::vector<std::string> made;
  const auto printable = [](const std::string& s) { return printable_text(s); };
  bool rtn = false;  // woq's round-to-nearest and AWQ checkpoints record a damp_percent that played no part
  if (const auto meta = j.find("meta"); meta != j.end() && meta->is_object()) {
    if (const auto who = meta->find("quantizer"); who != meta->end()) {
      if (who->is_string()) made.push_back(printable(who->get<std::string>()));
      if (who->is_array())
        for (const auto& w : *who)
          if (w.is_string() && made.size() < 4) made.push_back(printable(w.get<std::string>()));
    }
    if (const auto how = meta->find("woq_method"); how != meta->end() && how->is_string()) {
      made.push_back(printable(how->get<std::string>()));
      rtn = made.back() == "rtn" || made.back() == "awq";
    }
  }
  if (const auto damp = j.find("damp_percent"); !rtn && damp != j.end() && damp->is_number())
    made.push_back(fmt::format("damp_percent {}", damp->get<double>()));
  return fmt::format("{}", fmt::join(made, ", "));
}

QuantizationConfig gptq_config(const JsonFields& q, const nlohmann::ordered_json* dynamic) {
  QuantizationConfig c;
  c.method = QuantizationConfig::Method::kGptq;
  c.bits = read_bits(q, "bits");
  c.group_size = q.has("group_size") ? read_group_size(q, "group_size") : -1;
  c.sym = q.boolean("sym", true);
  c.desc_act = q.boolean("desc_act", false);
  c.lm_head = q.boolean("lm_head", false);
  const std::string format = q.string("checkpoint_format", "gptq");
  if (format == "gptq") {
    c.zeros = GptqZeros::kV1;
  } else if (format == "gptq_v2") {
    c.zeros = GptqZeros::kV2;
  } else {
    q.field_error("checkpoint_format", fmt::format("is '{}'; woq reads gptq and gptq_v2", format));
  }
  c.provenance = provenance_of(q.json());
  if (dynamic != nullptr) c.dynamic = dynamic_rules(*dynamic, q.path());
  return c;
}

// AutoAWQ's quantization_config (transformers' AwqConfig): bits, group_size, zero_point, version,
// modules_to_not_convert.
QuantizationConfig awq_config(const JsonFields& q) {
  QuantizationConfig c;
  c.method = QuantizationConfig::Method::kAwq;
  c.bits = read_bits(q, "bits");
  if (c.bits != 4) q.field_error("bits", fmt::format("is {}: AWQ checkpoints hold 4-bit weights", c.bits));
  c.group_size = q.has("group_size") ? read_group_size(q, "group_size") : 128;
  c.sym = false;
  if (!q.boolean("zero_point", true))
    q.field_error("zero_point", "is false: AutoAWQ writes checkpoints with zero points only (its GEMM and GEMV "
                                "packers need them); woq reads those");
  std::string version = q.string("version", "gemm");
  std::transform(version.begin(), version.end(), version.begin(), [](unsigned char ch) { return std::tolower(ch); });
  if (version == "gemm") {
    c.awq_version = AwqVersion::kGemm;
  } else if (version == "gemv") {
    c.awq_version = AwqVersion::kGemv;
  } else if (version == "gemv_fast" || version == "marlin") {
    q.field_error("version", fmt::format("is '{}': {} (woq reads AWQ's gemm and gemv layouts; convert with AutoAWQ "
                                         "to gemm)", version,
                                         version == "marlin" ? "Marlin's tiled, permuted layout is not read"
                                                             : "gemv_fast stores -scale * zero rounded to fp16 instead "
                                                               "of the zero point, and its own interleaved packing"));
  } else {
    q.field_error("version", fmt::format("is '{}'; woq reads AWQ's gemm and gemv layouts", printable(version)));
  }
  if (const auto skip = q.json().find("modules_to_not_convert"); skip != q.json().end() && !skip->is_null()) {
    if (!skip->is_array()) q.field_error("modules_to_not_convert", "must be a list of module names or null");
    for (const auto& name : *skip) {
      if (!name.is_string()) q.field_error("modules_to_not_convert", "must hold strings");
      c.not_converted.push_back(name.get<std::string>());
    }
  }
  if (q.has("dynamic")) q.field_error("dynamic", "is GPTQModel's per-module field; AWQ checkpoints have none");
  if (q.boolean("lm_head", false))
    q.field_error("lm_head", "is true: AutoAWQ keeps lm_head in float, and woq reads no quantized lm_head in AWQ's "
                             "layout (GPTQ checkpoints can hold one)");
  const std::string made = provenance_of(q.json());
  c.provenance = made.empty() ? "AutoAWQ layout" : "AutoAWQ layout; " + made;
  return c;
}

QuantizationConfig compressed_tensors_config(const JsonFields& q) {
  const std::string format = q.string("format", "");
  if (format != "pack-quantized")
    q.field_error("format", fmt::format("is '{}'; woq reads compressed-tensors pack-quantized only", format));
  if (!q.has("config_groups") || !q.json().at("config_groups").is_object() || q.json().at("config_groups").empty())
    q.field_error("config_groups", "must be a non-empty object");
  std::optional<QuantizationConfig> found;
  for (const auto& [name, group] : q.json().at("config_groups").items()) {
    const JsonFields g(group, q.path() + " config_groups." + name);
    if (g.has("input_activations") || g.has("output_activations"))
      g.field_error("input_activations", "is set: quantized activations are not supported (weight-only)");
    if (!g.has("weights")) g.field_error("weights", "is missing");
    const nlohmann::json& targets = g.json().contains("targets") ? g.json().at("targets") : nlohmann::json();
    if (!targets.is_array() || std::find(targets.begin(), targets.end(), nlohmann::json("Linear")) == targets.end())
      g.field_error("targets", fmt::format("is {}; woq reads groups that target \"Linear\"", describe_json(targets)));
    const JsonFields w(g.json().at("weights"), g.path() + ".weights");
    if (w.string("type", "int") != "int") w.field_error("type", "must be \"int\"");
    QuantizationConfig c;
    c.method = QuantizationConfig::Method::kCompressedTensors;
    c.bits = read_bits(w, "num_bits");
    c.sym = w.boolean("symmetric", true);
    const std::string strategy = w.string("strategy", "");
    if (strategy == "channel") {
      c.group_size = -1;
    } else if (strategy == "group") {
      c.group_size = read_group_size(w, "group_size");
    } else {
      w.field_error("strategy", fmt::format("is '{}'; woq reads group and channel", strategy));
    }
    c.desc_act = w.has("actorder");
    if (found && (found->bits != c.bits || found->group_size != c.group_size || found->sym != c.sym))
      g.field_error("weights", "differ from another config group's; mixed schemes are not supported");
    found = c;
  }
  return *found;
}

std::vector<std::int32_t> read_i32(const TensorView& t, const std::vector<std::int64_t>& shape, const char* why) {
  if (t.dtype != DType::kI32)
    fail("{}: tensor '{}' has dtype {}, expected I32", t.file, t.name, dtype_name(t.dtype));
  require_shape(t, shape, why);
  std::vector<std::int32_t> v(static_cast<std::size_t>(t.numel()));
  std::memcpy(v.data(), t.bytes.data(), v.size() * sizeof(std::int32_t));
  release_pages(t.bytes);  // read once: keep the mapping from staying resident
  return v;
}

// fp16 scales; BF16/F32 are accepted when every value converts exactly.
std::vector<std::uint16_t> read_scales(const TensorView& t, const std::vector<std::int64_t>& shape, const char* why) {
  require_shape(t, shape, why);
  std::vector<std::uint16_t> out(static_cast<std::size_t>(t.numel()));
  if (t.dtype == DType::kF16) {
    std::memcpy(out.data(), t.bytes.data(), out.size() * sizeof(std::uint16_t));
    release_pages(t.bytes);
    for (std::size_t i = 0; i < out.size(); ++i)
      if ((out[i] & 0x7c00) == 0x7c00)  // exponent all ones: Inf or NaN
        fail("{}: tensor '{}' holds {} at index {}", t.file, t.name, fp16_to_fp32(out[i]), i);
    return out;
  }
  require_float_dtype(t);
  std::vector<float> f(out.size());
  tensor_to_f32(t, f.data());
  for (std::size_t i = 0; i < f.size(); ++i) {
    out[i] = fp32_to_fp16(f[i]);
    if (!std::isfinite(f[i])) fail("{}: tensor '{}' holds {} at index {}", t.file, t.name, f[i], i);
    if (fp16_to_fp32(out[i]) != f[i])
      fail("{}: tensor '{}' value {} at index {} is not exactly representable in fp16", t.file, t.name, f[i], i);
  }
  return out;
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

QuantMatrix finish(const IntMatrix& m, const QuantizationConfig& c, const TensorView& anchor, ThreadPool* pool) {
  try {
    return from_int_matrix(m, c.group_size, c.sym, pool);
  } catch (const Error& e) {
    fail("{}: tensor '{}': {}", anchor.file, anchor.name, e.what());
  }
}

QuantMatrix load_gptq(const TensorStore& store, const QuantizationConfig& c, const std::string& prefix,
                      std::int64_t n, std::int64_t k, std::vector<std::string>& warnings, ThreadPool* pool) {
  GptqTensors t;
  t.bits = c.bits;
  t.k = k;
  t.n = n;
  t.groups = c.group_size == -1 ? 1 : ceil_div(k, c.group_size);
  const std::string why = fmt::format("K = {}, N = {}, bits = {}, group_size = {}", k, n, c.bits, c.group_size);
  const TensorView& qweight = store.get(prefix + ".qweight");
  t.qweight = read_i32(qweight, {t.qweight_rows(), n}, why.c_str());
  t.qzeros = read_i32(store.get(prefix + ".qzeros"), {t.groups, t.qzeros_cols()}, why.c_str());
  t.scales = read_scales(store.get(prefix + ".scales"), {t.groups, n}, why.c_str());
  if (const TensorView* g_idx = store.find(prefix + ".g_idx")) {
    t.g_idx = read_i32(*g_idx, {k}, why.c_str());
  } else {
    t.g_idx.resize(static_cast<std::size_t>(k));
    for (std::int64_t i = 0; i < k; ++i)
      t.g_idx[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(c.group_size == -1 ? 0 : i / c.group_size);
  }
  std::vector<std::string> local;
  const IntMatrix m = unpack_gptq(t, c.zeros, c.sym, local, pool);
  for (const auto& w : local) warnings.push_back(fmt::format("{}: {}", prefix, w));
  return finish(m, c, qweight, pool);
}

QuantMatrix load_awq(const TensorStore& store, const QuantizationConfig& c, const std::string& prefix, std::int64_t n,
                     std::int64_t k, ThreadPool* pool) {
  const TensorView& qweight = store.get(prefix + ".qweight");
  AwqTensors t;
  try {
    t = awq_layout(c.awq_version, n, k, c.group_size);
  } catch (const Error& e) {
    fail("{}: tensor '{}' ({}): {}", qweight.file, qweight.name, c.describe(), e.what());
  }
  const std::string why = fmt::format("{}, K = {}, N = {}, group_size = {}", c.describe(), k, n, c.group_size);
  t.qweight = read_i32(qweight, t.qweight_shape(), why.c_str());
  t.qzeros = read_i32(store.get(prefix + ".qzeros"), t.qzeros_shape(), why.c_str());
  t.scales = read_scales(store.get(prefix + ".scales"), t.scales_shape(), why.c_str());
  return finish(unpack_awq(t, pool), c, qweight, pool);
}

QuantMatrix load_pack_quantized(const TensorStore& store, const QuantizationConfig& c, const std::string& prefix,
                                std::int64_t n, std::int64_t k, ThreadPool* pool) {
  PackQuantizedTensors t;
  t.bits = c.bits;
  t.n = n;
  t.k = k;
  t.groups = c.group_size == -1 ? 1 : ceil_div(k, c.group_size);
  const std::int64_t per_word = 32 / c.bits;
  const std::string why = fmt::format("K = {}, N = {}, num_bits = {}, group_size = {}", k, n, c.bits, c.group_size);
  const TensorView& packed = store.get(prefix + ".weight_packed");
  t.weight_packed = read_i32(packed, {n, ceil_div(k, per_word)}, why.c_str());
  t.weight_scale = read_scales(store.get(prefix + ".weight_scale"), {n, t.groups}, why.c_str());
  if (const TensorView* shape = store.find(prefix + ".weight_shape")) {
    std::vector<std::int64_t> dims(2);
    if (shape->dtype == DType::kI64 && shape->shape == std::vector<std::int64_t>{2}) {
      std::memcpy(dims.data(), shape->bytes.data(), 16);
    } else {
      const std::vector<std::int32_t> d = read_i32(*shape, {2}, "[N, K]");
      dims = {d[0], d[1]};
    }
    if (dims != std::vector<std::int64_t>{n, k})
      fail("{}: tensor '{}' says [{}], but config.json implies [{}, {}]", shape->file, shape->name,
           fmt::join(dims, ", "), n, k);
  }
  if (!c.sym)
    t.weight_zero_point =
        read_i32(store.get(prefix + ".weight_zero_point"), {ceil_div(n, per_word), t.groups}, why.c_str());
  if (const TensorView* g_idx = store.find(prefix + ".weight_g_idx")) t.g_idx = read_i32(*g_idx, {k}, why.c_str());
  return finish(unpack_pack_quantized(t, c.group_size), c, packed, pool);
}

}  // namespace

std::string QuantizationConfig::describe() const {
  const std::string method_name = method == Method::kGptq ? (zeros == GptqZeros::kV1 ? "GPTQ v1" : "GPTQ v2")
                                  : method == Method::kAwq
                                      ? (awq_version == AwqVersion::kGemm ? "AWQ GEMM" : "AWQ GEMV")
                                      : "compressed-tensors pack-quantized";
  return fmt::format("{} {}-bit {} {}{}{}{}{}{}", method_name, bits, sym ? "sym" : "asym",
                     group_size == -1 ? std::string("per channel") : fmt::format("group_size {}", group_size),
                     desc_act ? " act-order" : "",
                     dynamic.empty() ? std::string() : fmt::format(" with {} per-module rules", dynamic.size()),
                     lm_head ? ", lm_head quantized too" : "",
                     not_converted.empty()       ? std::string()
                     : not_converted.size() <= 2 ? fmt::format(" except {}", printable_text(fmt::format(
                                                                                 "{}", fmt::join(not_converted, ", "))))
                                                 : fmt::format(" except {} modules_to_not_convert", not_converted.size()),
                     provenance.empty() ? "" : " (" + provenance + ")");
}

std::optional<QuantizationConfig> QuantizationConfig::for_module(const std::string& prefix) const {
  for (const std::string& name : not_converted)
    if (prefix.find(name) != std::string::npos) return std::nullopt;
  for (const DynamicRule& rule : dynamic) {
    // All matching of one config's rules shares a CPU-time budget: rules that backtrack a lot at every module
    // fail within seconds instead of slowing every load down.
    const std::clock_t t0 = std::clock();
    const bool match = rule.regex->match_at_start(prefix);
    *dynamic_cpu_seconds += static_cast<double>(std::clock() - t0) / CLOCKS_PER_SEC;
    if (*dynamic_cpu_seconds > kDynamicBudgetSeconds)
      fail("config.json quantization_config.dynamic: matching its {} rules against the module names took more than "
           "{} s of CPU time (at '{}', rule '{}'); simplify the patterns", dynamic.size(), kDynamicBudgetSeconds,
           prefix, printable(rule.key));
    if (!match) continue;
    if (rule.skip) return std::nullopt;
    QuantizationConfig c = *this;
    c.dynamic.clear();
    c.bits = rule.bits.value_or(bits);
    c.group_size = rule.group_size.value_or(group_size);
    c.sym = rule.sym.value_or(sym);
    c.desc_act = rule.desc_act.value_or(desc_act);
    return c;
  }
  return *this;
}

std::optional<QuantizationConfig> read_quantization_config(const std::string& dir) {
  if (is_gguf_path(dir)) return std::nullopt;  // a GGUF's quantized types are per tensor (DType::kGgml)
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  const JsonFields config(read_json_file(path), path);
  if (!config.has("quantization_config")) return std::nullopt;
  const JsonFields q(config.json().at("quantization_config"), path + " quantization_config");
  if (!q.has("quant_method")) q.field_error("quant_method", "is missing");
  const std::string method = q.string("quant_method", "");
  if (method == "gptq") {
    if (!q.has("dynamic")) return gptq_config(q, nullptr);
    // The rules' order decides (the first match wins): read them again, in the file's order.
    const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(read_text_file(path));
    return gptq_config(q, &ordered.at("quantization_config").at("dynamic"));
  }
  if (method == "awq") return awq_config(q);
  if (method == "compressed-tensors") return compressed_tensors_config(q);
  q.field_error("quant_method", fmt::format("is '{}'; woq loads gptq, awq and compressed-tensors checkpoints", method));
}

nlohmann::ordered_json gptq_config_json(const QuantizationConfig& c, double damp_percent, bool static_groups,
                                        bool true_sequential) {
  nlohmann::ordered_json j = {{"quant_method", "gptq"},
          {"bits", c.bits},
          {"group_size", c.group_size},
          {"desc_act", c.desc_act},
          {"sym", c.sym},
          {"damp_percent", damp_percent},
          {"static_groups", static_groups},
          {"true_sequential", true_sequential},
          {"checkpoint_format", c.zeros == GptqZeros::kV1 ? "gptq" : "gptq_v2"}};
  if (c.lm_head) j["lm_head"] = true;
  if (c.dynamic.empty()) return j;
  nlohmann::ordered_json& rules = j["dynamic"] = nlohmann::ordered_json::object();
  for (const DynamicRule& rule : c.dynamic) {
    nlohmann::ordered_json& o = rules[rule.key] = nlohmann::ordered_json::object();
    if (rule.bits) o["bits"] = *rule.bits;
    if (rule.group_size) o["group_size"] = *rule.group_size;
    if (rule.sym) o["sym"] = *rule.sym;
    if (rule.desc_act) o["desc_act"] = *rule.desc_act;
  }
  return j;
}

nlohmann::ordered_json awq_config_json(const QuantizationConfig& c) {
  return {{"quant_method", "awq"},
          {"bits", c.bits},
          {"group_size", c.group_size},
          {"zero_point", true},
          {"version", c.awq_version == AwqVersion::kGemm ? "gemm" : "gemv"},
          {"modules_to_not_convert",
           c.not_converted.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(c.not_converted)}};
}

std::optional<QuantMatrix> load_quantized_linear(const TensorStore& store, const QuantizationConfig& checkpoint,
                                                 const std::string& prefix, std::int64_t rows, std::int64_t cols,
                                                 std::vector<std::string>& warnings, ThreadPool* pool) {
  const std::optional<QuantizationConfig> module = checkpoint.for_module(prefix);
  if (!module) {
    if (store.find(prefix + ".qweight") != nullptr)
      fail("{}: '{}.qweight' exists, but config.json's quantization_config ({}) keeps '{}' unquantized",
           store.source(), prefix, checkpoint.method == QuantizationConfig::Method::kAwq ? "modules_to_not_convert"
                                                                                          : "dynamic", prefix);
    return std::nullopt;
  }
  const QuantizationConfig& config = *module;
  if (store.find(prefix + ".qweight") != nullptr) {
    if (config.method == QuantizationConfig::Method::kAwq) return load_awq(store, config, prefix, rows, cols, pool);
    if (config.method != QuantizationConfig::Method::kGptq)
      fail("{}: '{}.qweight' is a GPTQ or AWQ tensor, but config.json says {}", store.source(), prefix,
           config.describe());
    return load_gptq(store, config, prefix, rows, cols, warnings, pool);
  }
  if (store.find(prefix + ".weight_packed") != nullptr) {
    if (config.method != QuantizationConfig::Method::kCompressedTensors)
      fail("{}: '{}.weight_packed' is a compressed-tensors tensor, but config.json says {}", store.source(), prefix,
           config.describe());
    return load_pack_quantized(store, config, prefix, rows, cols, pool);
  }
  return std::nullopt;
}

}  // namespace woq

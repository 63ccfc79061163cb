#include "quantize/pareto.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "arch/architecture.h"
#include "core/error.h"
#include "formats/kquant.h"
#include "io/json_file.h"
#include "quantize/plan_request.h"

namespace woq {

namespace {

// The woq format of about the bits of a ggml type a row length cannot hold.
QuantSpec stand_in(GgmlType type) {
  switch (type) {
    case GgmlType::kQ2_K: return {LowBit::kSymInt4, -1};
    case GgmlType::kQ3_K: return {LowBit::kSymInt4, 128};
    case GgmlType::kQ4_K: return {LowBit::kSymInt4, 32};
    case GgmlType::kQ5_K: return {LowBit::kAsymInt4, 32};
    default: return {LowBit::kSymInt8, -1};
  }
}

// The uniform plans every layer can take: the candidates of the shortest row length.
std::vector<QuantSpec> uniform_specs(const Sensitivity& s) {
  std::vector<QuantSpec> out;
  for (const CandidateCost& c : s.layers.front().candidates) {
    const nlohmann::ordered_json want = spec_json(c.spec);
    const bool everywhere = std::all_of(s.layers.begin(), s.layers.end(), [&](const LayerCost& l) {
      return l.kept_unless_named() ||  // a uniform plan leaves lm_head and the embeddings as stored
             std::any_of(l.candidates.begin(), l.candidates.end(),
                         [&](const CandidateCost& d) { return spec_json(d.spec) == want; });
    });
    if (everywhere && c.spec.type != LowBit::kFp16) out.push_back(c.spec);
  }
  return out;
}

std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') q += '\\';
    q += ch;
  }
  return q + "\"";
}

}  // namespace

QuantPlan rule_plan(const kquant::Mix& mix, const ModelConfig& c) {
  const ArchitectureSpec& arch = *find_architecture(c.architecture);
  const kquant::MixModel model{c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
                               !c.tie_word_embeddings, arch.gguf_architecture, arch.fused_projections};
  QuantPlan plan;
  plan.source = fmt::format("{} rule", mix.llama_name);
  plan.base = QuantSpec{kquant::find(mix.base)->type, kquant::kSuperBlock};
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (const LinearSpec& spec : kBlockLinears) {
      const std::int64_t k = c.size(spec.cols);
      const kquant::MixChoice choice = kquant::mix_type(mix, {kquant::MixTensor::kBlockLinear, spec.role, l, k}, model);
      const kquant::Format* f = kquant::find(choice.ruled);
      QuantSpec chosen = f != nullptr && k % kquant::kSuperBlock == 0 ? QuantSpec{f->type, kquant::kSuperBlock}
                                                                        : stand_in(choice.ruled);
      if (is_quantized(chosen.type) && chosen.group_size >= k) chosen.group_size = -1;  // one group per row
      plan.tensors[plan_module(l, spec.role)] = chosen;
    }
  return plan;
}

std::vector<ParetoPoint> run_pareto(const ParetoRequest& r, ThreadPool& pool,
                                    const std::function<void(const std::string&)>& log) {
  if (r.file.empty()) fail("eval pareto needs held-out text: --file FILE");
  if (r.calib_file.empty() == r.measurement.empty())
    fail("eval pareto: give --calib-file (to measure) or --measurement (a saved woq quantize --measure), one of them");
  if (!r.png.empty() && !r.json.empty()) {
    std::error_code e1, e2;
    if (std::filesystem::weakly_canonical(r.png, e1) == std::filesystem::weakly_canonical(r.json, e2))
      fail("-o and --json name the same file, {}", r.png);
  }
  for (const std::string* out : {&r.png, &r.json})
    if (!out->empty()) require_new_output(*out, true, {&r.input, &r.calib_file, &r.measurement, &r.file});
  if (!r.png.empty() && std::system("gnuplot --version > /dev/null 2>&1") != 0)
    fail("{}: gnuplot is not installed (Debian: apt-get install gnuplot-nox; tools/install-deps.sh installs it); "
         "--json writes the points without it", r.png);
  PlanEvaluator eval(r.input, r.calib_file, r.measurement, r.file, r.ctx, r.chunks, pool, log);
  const Sensitivity& s = eval.sensitivity();
  std::vector<ParetoPoint> points;
  const auto add = [&](const std::string& kind, const std::string& name, const QuantPlan& plan) {
    const SolvedPlan predicted = predict(s, plan);
    const CompareStats st = eval.measure(plan);
    points.push_back({kind, name, predicted.bytes, predicted.bits_per_weight, predicted.predicted_kl, st.mean_kl,
                      st.kl_stderr, st.same_top, st.ppl_ratio});
    const ParetoPoint& p = points.back();
    if (log)
      log(fmt::format("{:8} {:24} {:7.3f} bpw  KL {:.4g} +/- {:.2g} (predicted {:.4g})  same top {:.2f} %", kind, name,
                      p.bits_per_weight, p.mean_kl, p.kl_stderr, p.predicted_kl, 100 * p.same_top));
  };
  std::vector<double> sizes;
  for (const QuantSpec& spec : uniform_specs(s)) {
    QuantPlan plan;
    plan.base = spec;
    plan.source = spec_name(spec);
    add("uniform", spec_name(spec), plan);
    sizes.push_back(points.back().bits_per_weight);
  }
  for (const kquant::Mix& mix : kquant::mixes()) {
    QuantPlan plan = rule_plan(mix, eval.config());
    // Rules whose K-quants a row length cannot hold measure stand-ins the measurement may lack: skip those.
    try {
      predict(s, plan);
    } catch (const Error&) {
      continue;
    }
    add("rule", plan.source, plan);
    sizes.push_back(points.back().bits_per_weight);
  }
  // Plans at those sizes and at evenly spaced ones between (the curve between the formats), or between the
  // smallest and the most accurate plans when no format fits every layer.
  const double first = sizes.empty() ? smallest_bpw(s) : *std::min_element(sizes.begin(), sizes.end());
  const double last =
      sizes.empty() ? solve_for_bpw(s, 1e30).bits_per_weight : *std::max_element(sizes.begin(), sizes.end());
  sizes.push_back(first);
  sizes.push_back(last);
  for (int i = 1; i < 10; ++i) sizes.push_back(first + (last - first) * i / 10.0);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  for (const double bpw : sizes) {
    SolvedPlan solved = solve_for_bpw(s, bpw);
    solved.plan.source = fmt::format("plan @ {:.3f} bpw", bpw);
    add("plan", solved.plan.source, solved.plan);
  }
  if (!r.json.empty()) write_json_file(r.json, pareto_json(points));
  if (!r.png.empty()) plot_pareto(points, std::filesystem::path(r.input).filename().string(), r.png);
  return points;
}

nlohmann::ordered_json pareto_json(const std::vector<ParetoPoint>& points) {
  nlohmann::ordered_json j = nlohmann::ordered_json::array();
  for (const ParetoPoint& p : points)
    j.push_back({{"kind", p.kind}, {"name", p.name}, {"bytes", p.bytes}, {"bits_per_weight", p.bits_per_weight},
                 {"predicted_kl", p.predicted_kl}, {"mean_kl", p.mean_kl}, {"kl_stderr", p.kl_stderr},
                 {"same_top", p.same_top}, {"ppl_ratio", p.ppl_ratio}});
  return j;
}

void plot_pareto(const std::vector<ParetoPoint>& points, const std::string& title, const std::string& path) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("woq-pareto-{}", static_cast<long>(::getpid()));
  std::filesystem::create_directories(dir);
  const auto cleanup = [&] {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  };
  std::string script = fmt::format(
      "set terminal pngcairo size 1100,700 noenhanced font 'sans,11'\nset output {}\nset title {}\n"
      "set xlabel 'bits per weight (whole model)'\nset ylabel 'mean KL divergence vs float (nats per token)'\n"
      "set logscale y\nset grid\nset key top right\n",
      quoted(path + ".tmp"), quoted(title));
  std::vector<std::string> plots;
  for (const char* kind : {"uniform", "rule", "plan"}) {
    std::string data;
    for (const ParetoPoint& p : points)
      if (p.kind == kind)
        data += fmt::format("{} {} {} {}\n", p.bits_per_weight, std::max(p.mean_kl, 1e-7), p.kl_stderr, quoted(p.name));
    if (data.empty()) continue;
    const std::filesystem::path file = dir / (std::string(kind) + ".dat");
    std::ofstream(file) << data;
    const std::string f = quoted(file.string());
    if (std::string_view(kind) == "plan") {
      plots.push_back(fmt::format("{} using 1:2 with linespoints lw 2 pt 7 title 'woq plans (solved for each size)'", f));
    } else {
      const char* style = std::string_view(kind) == "uniform" ? "pt 5 ps 1.3" : "pt 9 ps 1.5";
      plots.push_back(fmt::format("{} using 1:2:3 with yerrorbars {} title '{}'", f, style,
                                  std::string_view(kind) == "uniform" ? "uniform formats" : "llama-quantize rules"));
      plots.push_back(fmt::format("{} using 1:2:4 with labels offset 0.6,0.4 left rotate by 30 font ',7' {} notitle", f,
                                  std::string_view(kind) == "uniform" ? "tc rgb '#5000a0'" : "tc rgb '#2080b0'"));
    }
  }
  script += "plot " + fmt::format("{}", fmt::join(plots, ", \\\n     ")) + "\n";
  std::ofstream(dir / "plot.gp") << script;
  const std::string command = fmt::format("gnuplot {} 2>&1", quoted((dir / "plot.gp").string()));
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    cleanup();
    fail("{}: cannot run gnuplot", path);
  }
  std::string said;
  char buf[512];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) said += buf;
  const int status = ::pclose(pipe);
  cleanup();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::error_code ec;
    std::filesystem::remove(path + ".tmp", ec);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
      fail("{}: gnuplot is not installed (Debian: apt-get install gnuplot-nox; tools/install-deps.sh installs it); "
           "--json writes the points without it", path);
    fail("{}: gnuplot failed: {}", path, said);
  }
  std::filesystem::rename(path + ".tmp", path);
}

}  // namespace woq

// woq._woq: the C++ engine for Python (pybind11). Thin: every call is one of
// the library calls the CLI makes (model/load_request.h, generate/generate.h,
// generate/chat_template.h, LlamaModel::forward, quantize/quantize_request.h,
// eval/reports.h); python/woq/__init__.py and eval.py add the docstrings,
// defaults, progress bars and the streaming generator.
//
// Threads: every call that runs the model releases the GIL. generate() takes it
// back for each piece of text, and the long calls (load, quantize, eval) for
// each progress step, to call the Python callback and to let a pending Ctrl-C
// raise KeyboardInterrupt, which ends the call; the model stays usable. One model runs one call at a time (a mutex); two models run in
// parallel from two Python threads.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "eval/recovery_report.h"
#include "eval/reports.h"
#include "generate/chat_template.h"
#include "generate/generate.h"
#include "generate/model_session.h"
#include "io/hf_config_writer.h"
#include "jinja/jinja.h"
#include "model/llama.h"
#include "model/load_request.h"
#include "quantize/quantize_checkpoint.h"
#include "quantize/pareto.h"
#include "quantize/plan_request.h"
#include "quantize/quantize_request.h"
#include "tokenizer/tokenizer.h"

namespace py = pybind11;

namespace woq::python {

namespace {

// A loaded model with what runs it (the CLI's ModelSession), and what Python adds.
struct Model : ModelSession {
  LoadOptions options;
  std::vector<std::string> summary;  ///< notes, warnings and the load summary, as the CLI prints them
  std::mutex busy;
  ConversationCache conversation;  ///< chat()'s KV cache, kept between calls (guarded by busy)
};

// Runs `check` (a validation of arguments), turning its woq::Error into ValueError.
template <class Check>
auto argument_check(Check check) {
  try {
    return check();
  } catch (const Error& e) {
    throw py::value_error(e.what());
  }
}

// A Python object the engine may copy and drop without the GIL (std::function copies): the copies share one
// reference, released with the GIL.
std::shared_ptr<py::object> shared_object(const py::object& o) {
  return {new py::object(o), [](py::object* p) {
            py::gil_scoped_acquire locked;
            delete p;
          }};
}

// The engine's side of a progress argument: None or False -> no progress; True -> the engine's own terminal line
// (terminal_progress); a callable -> called as progress(done, total) with the GIL. Each step also lets a pending
// Ctrl-C raise KeyboardInterrupt (error_already_set unwinds the engine), whatever the argument.
Progress progress_of(const py::object& progress, const char* what) {
  const auto check_signals = [] {
    py::gil_scoped_acquire locked;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  };
  if (progress.is_none() || (py::isinstance<py::bool_>(progress) && !progress.cast<bool>()))
    return [check_signals](std::int64_t, std::int64_t) { check_signals(); };
  if (py::isinstance<py::bool_>(progress))
    return [line = terminal_progress(what), check_signals](std::int64_t done, std::int64_t total) {
      if (line) line(done, total);
      check_signals();
    };
  if (!PyCallable_Check(progress.ptr())) throw py::value_error("progress must be None, a bool or a callable");
  return [f = shared_object(progress)](std::int64_t done, std::int64_t total) {
    py::gil_scoped_acquire locked;
    (*f)(done, total);
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  };
}

// Lines for a Python callable (with the GIL); null for None.
std::function<void(const std::string&)> log_of(const py::object& log) {
  if (log.is_none()) return nullptr;
  return [f = shared_object(log)](const std::string& line) {
    py::gil_scoped_acquire locked;
    (*f)(py::bytes(line).attr("decode")("utf-8", "replace"));
  };
}

std::unique_ptr<Model> load(const std::string& path, const LoadRequest& request, int threads, const py::object& progress) {
  auto m = std::make_unique<Model>();
  m->options = argument_check([&] { return parse_load_request(request, &m->summary); });
  m->options.progress = progress_of(progress, "layer");
  if (threads < 0) throw py::value_error("threads must be >= 0 (0 = all cores), got " + std::to_string(threads));
  py::gil_scoped_release unlocked;
  m->open(path, threads);
  m->load(m->options);
  m->options.progress = nullptr;  // the callback is for this load only
  for (std::string& line : load_summary(m->report, m->options)) m->summary.push_back(std::move(line));
  return m;
}

ModelIdentity identity(const Model& m) { return {model_label(m.path, m.report), m.report.low_bit}; }

// A report as (text, JSON text) for woq/eval.py.
std::pair<std::string, std::string> as_pair(const EvalReport& r) {
  return {r.text, r.json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
}

ScoringPlan plan_of(const Model& m, const std::string& text, const std::string& source, const ScoringRequest& request) {
  if (request.ctx <= 0) throw py::value_error("ctx must be > 0, got " + std::to_string(request.ctx));
  if (request.batch < 0 || request.chunks < 0) throw py::value_error("batch and chunks must be >= 0");
  return scoring_plan(*m.tokenizer, text, source, request, m.model->context_limit());
}

std::pair<std::string, std::string> perplexity(Model& m, const std::string& text, const std::string& source,
                                               const ScoringRequest& request, const py::object& progress) {
  const Progress bar = progress_of(progress, "chunk");
  py::gil_scoped_release unlocked;
  const std::lock_guard<std::mutex> lock(m.busy);
  const ScoringPlan plan = plan_of(m, text, source, request);
  return as_pair(perplexity_report(*m.model, identity(m), plan, request, bar));
}

// eval compare with both models loaded: the reference's log-probabilities through an anonymous temporary file,
// then the candidate, and (rounded activations against a reference without) the candidate's weights again with f32
// activations, as the CLI does.
std::pair<std::string, std::string> compare(Model& m, Model& ref, const std::string& text, const std::string& source,
                                            const ScoringRequest& request, const py::object& progress) {
  const Progress ref_bar = progress_of(progress, "reference"), bar = progress_of(progress, "candidate"),
                 f32_bar = progress_of(progress, "f32 activations");
  py::gil_scoped_release unlocked;
  std::unique_lock<std::mutex> lock_m(m.busy, std::defer_lock), lock_ref(ref.busy, std::defer_lock);
  if (&m == &ref) {
    lock_m.lock();
  } else {
    std::lock(lock_m, lock_ref);
  }
  const std::int64_t vocab = m.model->config().vocab_size;
  if (ref.model->config().vocab_size != vocab)
    fail("the reference {} has a vocabulary of {}, the model {}", ref.path, ref.model->config().vocab_size, vocab);
  require_same_vocabulary(*m.tokenizer, m.path, *ref.tokenizer, ref.path);
  const ScoringPlan plan = plan_of(m, text, source, request);
  RefLogprobFile file = RefLogprobFile::create("", plan, vocab);
  write_reference(*ref.model, plan, request.batch, file, ref_bar);
  const auto load_f32 = [&] {
    LoadOptions options = m.options;
    options.activations = Activations::kF32;
    return LlamaModel::load(m.path, options, *m.pool);
  };
  const auto [s, weights_only] = compare_candidate(*m.model, m.report, ref.report.rounded_activations, load_f32, plan,
                                                   request.batch, file, bar, f32_bar);
  return as_pair(compare_report(s, weights_only ? &*weights_only : nullptr, identity(m), model_label(ref.path, ref.report),
                                m.report.activations, plan, request));
}

std::pair<std::string, std::string> tasks(Model& m, const std::string& specs, const std::string& data_dir,
                                          const TaskOptions& options, const py::object& log, const py::object& progress) {
  if (options.shots < -1) throw py::value_error("num_fewshot must be None or >= 0, got " + std::to_string(options.shots));
  if (options.limit < 0) throw py::value_error("limit must be None or > 0, got " + std::to_string(options.limit));
  const auto say = log_of(log);
  std::vector<Progress> bars;
  py::gil_scoped_release unlocked;
  const std::vector<Task> list = load_task_list(specs, data_dir, say);
  for (const Task& t : list) check_fewshot(t, options);
  {
    py::gil_scoped_acquire locked;  // the callbacks are Python objects
    for (const Task& t : list) bars.push_back(progress_of(progress, t.name.c_str()));
  }
  const std::lock_guard<std::mutex> lock(m.busy);
  return as_pair(tasks_report(run_tasks(*m.model, *m.tokenizer, list, options, bars), model_label(m.path, m.report)));
}

// eval recovery with loaded models: the baseline, then each variant, scored on the same tasks (and perplexity
// text) by the CLI's calls; the report is the CLI's.
std::pair<std::string, std::string> recovery(Model& baseline, const std::vector<Model*>& variants,
                                             const std::string& specs, const std::string& data_dir,
                                             const TaskOptions& options, const std::optional<std::string>& ppl_text,
                                             const std::string& ppl_source, std::int64_t ctx, const py::object& log,
                                             const py::object& progress) {
  if (variants.empty()) throw py::value_error("recovery needs at least one variant model");
  if (ctx <= 0) throw py::value_error("ctx must be > 0, got " + std::to_string(ctx));
  std::vector<Model*> models = {&baseline};
  models.insert(models.end(), variants.begin(), variants.end());
  for (const Model* v : variants) require_same_vocabulary(*v->tokenizer, v->path, *baseline.tokenizer, baseline.path);
  const auto say = log_of(log);
  py::gil_scoped_release unlocked;
  const std::vector<Task> list = load_task_list(specs, data_dir, say);
  for (const Task& t : list) check_fewshot(t, options);
  std::optional<ScoringPlan> ppl;
  if (ppl_text) {
    try {
      ppl = chunk_plan(baseline.tokenizer->encode(*ppl_text), ctx, 0, chunk_bos(*baseline.tokenizer));
    } catch (const Error& e) {
      if (std::string_view(e.what()).starts_with(ppl_source)) throw;  // "the text has 3 tokens ..."
      fail("{}: {}", ppl_source, e.what());
    }
  }
  std::vector<RecoveryColumn> columns;
  std::vector<TaskResult> shapes;
  for (Model* m : models) {
    std::vector<Progress> bars;
    {
      py::gil_scoped_acquire locked;  // the callbacks are Python objects
      for (const Task& t : list) bars.push_back(progress_of(progress, t.name.c_str()));
    }
    const std::lock_guard<std::mutex> lock(m->busy);
    RecoveryColumn col{m->path, m->report.low_bit, model_label(m->path, m->report), {}, {}};
    std::vector<TaskResult> results =
        score_recovery_column(*m->model, *m->tokenizer, list, options, bars, ppl ? &*ppl : nullptr, col);
    if (columns.empty()) shapes = std::move(results);
    columns.push_back(std::move(col));
  }
  std::optional<RecoveryPerplexity> ppl_of;
  if (ppl) ppl_of = RecoveryPerplexity{ppl_source, ctx};
  return as_pair(recovery_report(std::move(columns), shapes, options.bootstrap, options.seed, ppl_of));
}

std::pair<std::string, std::string> explain(Model& original, Model& quantized, const std::string& prompt,
                                            std::int64_t max_new_tokens, std::int64_t top) {
  if (max_new_tokens <= 0) throw py::value_error("max_new_tokens must be > 0, got " + std::to_string(max_new_tokens));
  if (top <= 0) throw py::value_error("top must be > 0, got " + std::to_string(top));
  if (&original == &quantized)
    throw py::value_error("explain needs two models: the original and the quantized one (the same object was given twice)");
  require_same_vocabulary(*quantized.tokenizer, quantized.path, *original.tokenizer, original.path);
  py::gil_scoped_release unlocked;
  std::scoped_lock lock(original.busy, quantized.busy);
  const Explanation e = woq::explain(*original.model, *quantized.model, *quantized.tokenizer, prompt, max_new_tokens);
  return as_pair(explain_report(e, *quantized.tokenizer, prompt, identity(original), identity(quantized), top));
}

void quantize(const QuantizeRequest& request, int threads, const py::object& log, const py::object& progress) {
  if (threads < 0) throw py::value_error("threads must be >= 0 (0 = all cores), got " + std::to_string(threads));
  argument_check([&] { validate(request); });
  const QuantizeCallbacks callbacks{log_of(log), progress_of(progress, "layer"), nullptr};
  py::gil_scoped_release unlocked;
  ThreadPool pool(threads);
  run_quantize_request(request, pool, callbacks);
}

void plan_search(const PlanRequest& request, int threads, const py::object& log) {
  if (threads < 0) throw py::value_error("threads must be >= 0 (0 = all cores), got " + std::to_string(threads));
  const auto say = log_of(log);
  py::gil_scoped_release unlocked;
  ThreadPool pool(threads);
  run_plan_request(request, pool, say);
}

// The points as pareto_json's text (parsed in Python).
std::string pareto(const ParetoRequest& request, int threads, const py::object& log) {
  if (threads < 0) throw py::value_error("threads must be >= 0 (0 = all cores), got " + std::to_string(threads));
  const auto say = log_of(log);
  py::gil_scoped_release unlocked;
  ThreadPool pool(threads);
  return pareto_json(run_pareto(request, pool, say)).dump();
}

SamplingParams sampling(float temperature, std::int32_t top_k, float top_p, std::optional<std::uint64_t> seed) {
  SamplingParams p{temperature, top_k, top_p, seed.value_or(std::random_device{}())};
  argument_check([&] { validate(p); });
  return p;
}

// Generation from `prompt` (str: tokenized with BOS as the tokenizer adds it; list: ids as given).
py::dict generate(Model& m, const std::variant<std::string, std::vector<std::int32_t>>& prompt,
                  std::int64_t max_new_tokens, float temperature, std::int32_t top_k, float top_p,
                  std::optional<std::uint64_t> seed, const std::vector<std::string>& stop, const Penalties& penalties,
                  const std::optional<py::function>& on_text, bool keep_cache) {
  if (max_new_tokens < 0) throw py::value_error("max_new_tokens must be >= 0, got " + std::to_string(max_new_tokens));
  GenerateOptions gen;
  gen.max_new_tokens = max_new_tokens;
  gen.sampling = sampling(temperature, top_k, top_p, seed);
  gen.penalties = penalties;
  argument_check([&] { validate(gen.penalties); });
  for (const std::string& s : stop)
    if (s.empty()) throw py::value_error("stop strings must not be empty");
  gen.stop_strings = stop;
  gen.echo_prompt = false;
  if (keep_cache) gen.conversation = &m.conversation;
  // Each piece: to the callback, and a chance for Ctrl-C (error_already_set ends generate by unwinding).
  const auto piece = [&on_text](std::string_view text) {
    py::gil_scoped_acquire locked;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (on_text && !text.empty()) (*on_text)(py::bytes(text.data(), text.size()).attr("decode")("utf-8", "replace"));
  };
  GenerateResult r;
  {
    py::gil_scoped_release unlocked;
    const std::lock_guard<std::mutex> lock(m.busy);
    if (const auto* text = std::get_if<std::string>(&prompt))
      r = woq::generate(*m.model, *m.tokenizer, *text, gen, piece);
    else
      r = woq::generate(*m.model, *m.tokenizer, std::get<std::vector<std::int32_t>>(prompt), gen, piece);
  }
  py::dict out;
  out["text"] = py::bytes(r.text).attr("decode")("utf-8", "replace");
  out["prompt_ids"] = r.prompt_ids;
  out["generated_ids"] = r.generated_ids;
  out["stop_token"] = r.stop_token >= 0 ? py::object(py::int_(r.stop_token)) : py::object(py::none());
  out["stop_string"] = r.stop_string.empty() ? py::object(py::none()) : py::object(py::str(r.stop_string));
  out["context_full"] = r.context_full;
  out["cached_tokens"] = r.cached_tokens;
  out["prefill_seconds"] = r.prefill_seconds;
  out["decode_seconds"] = r.decode_seconds;
  return out;
}

// Logits [len(ids), vocab] of one forward pass over `ids` from an empty KV cache.
py::array_t<float> logits(Model& m, const std::vector<std::int32_t>& ids) {
  const std::int64_t n = static_cast<std::int64_t>(ids.size()), vocab = m.model->config().vocab_size;
  if (n == 0) throw py::value_error("logits: ids is empty");
  if (n > m.model->context_limit())
    throw py::value_error("logits: " + std::to_string(n) + " ids exceed the model's context of " +
                          std::to_string(m.model->context_limit()) + " tokens");
  for (const std::int32_t id : ids)
    if (id < 0 || id >= vocab)
      throw py::value_error("logits: id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  std::vector<float> out;
  {
    py::gil_scoped_release unlocked;
    const std::lock_guard<std::mutex> lock(m.busy);
    KVCache cache = m.model->make_cache(n);
    m.model->forward(ids, cache, true, out);
  }
  py::array_t<float> a({n, vocab});
  std::copy(out.begin(), out.end(), a.mutable_data());
  return a;
}

// The model's float checkpoint with its linear layers in the model's format, written as woq quantize writes
// GPTQ (round to nearest: the integers the model runs with). Returns what woq quantize prints.
std::vector<std::string> save_pretrained(Model& m, const std::string& out_dir, bool force) {
  if (m.report.prequantized())
    throw py::value_error(m.path + " is already quantized (" + m.report.imported_format +
                          "): save_pretrained writes a float checkpoint's layers in the loaded format");
  if (!is_quantized(m.options.linear.type))
    throw py::value_error("save_pretrained writes GPTQ checkpoints of integer formats (sym_int4, asym_int4, "
                          "sym_int8); this model's linear layers are " + std::string(low_bit_name(m.options.linear.type)));
  // A plan (its lm_head too) is written as `woq quantize --plan` writes it; an lm_head converted without one is not.
  const auto same = [](const std::optional<QuantSpec>& a, const std::optional<QuantSpec>& b) {
    return a.has_value() == b.has_value() && (!a || spec_json(*a) == spec_json(*b));
  };
  if (!same(m.options.lm_head, m.options.plan ? m.options.plan->lm_head() : std::nullopt))
    throw py::value_error("lm_head_low_bit: save_pretrained writes lm_head as a plan names it; give lm_head in the "
                          "plan instead (optimize_model(path, plan=...))");
  QuantizeOptions options;
  options.spec = m.options.linear;
  options.plan = m.options.plan;
  options.force = force;
  std::vector<std::string> lines;
  options.progress = [&lines](const std::string& line) { lines.push_back(line); };
  QuantizeReport r;
  {
    py::gil_scoped_release unlocked;
    const std::lock_guard<std::mutex> lock(m.busy);
    r = quantize_checkpoint(m.path, out_dir, options, *m.pool);
  }
  for (const std::string& note : r.notes) lines.push_back("note: " + note);
  lines.push_back(fmt::format("wrote {} (GPTQ, {}, rtn): {} linear layers in {:.2f} s", out_dir,
                              options.plan ? "plan " + options.plan->source : describe(options.spec), r.matrices,
                              r.seconds));
  return lines;
}

std::string chat_prompt(const Model& m, const std::string& messages_json, bool add_generation_prompt) {
  nlohmann::ordered_json messages;
  try {
    messages = nlohmann::ordered_json::parse(messages_json);
  } catch (const nlohmann::json::exception& e) {
    throw py::value_error(std::string("messages: ") + e.what());
  }
  return m.chat_template->render(messages, add_generation_prompt);
}

// The plan search's and eval pareto's requests (woq.quantize(target_kl=...), woq.eval.pareto).
void bind_plan_requests(py::module_& mod) {
  py::class_<PlanRequest>(mod, "PlanRequest")
      .def(py::init<>())
      .def_readwrite("input", &PlanRequest::input)
      .def_readwrite("output", &PlanRequest::output)
      .def_readwrite("force", &PlanRequest::force)
      .def_readwrite("measure_only", &PlanRequest::measure_only)
      .def_readwrite("target_kl", &PlanRequest::target_kl)
      .def_readwrite("target_bpw", &PlanRequest::target_bpw)
      .def_readwrite("measurement", &PlanRequest::measurement)
      .def_readwrite("calib_file", &PlanRequest::calib_file)
      .def_readwrite("verify_file", &PlanRequest::verify_file)
      .def_readwrite("ctx", &PlanRequest::ctx)
      .def_readwrite("chunks", &PlanRequest::chunks)
      .def_readwrite("refine", &PlanRequest::refine)
      .def_readwrite("candidates", &PlanRequest::candidates)
      .def_readwrite("estimate", &PlanRequest::estimate)
      .def_readwrite("estimate_rows", &PlanRequest::estimate_rows);
  py::class_<ParetoRequest>(mod, "ParetoRequest")
      .def(py::init<>())
      .def_readwrite("input", &ParetoRequest::input)
      .def_readwrite("calib_file", &ParetoRequest::calib_file)
      .def_readwrite("measurement", &ParetoRequest::measurement)
      .def_readwrite("file", &ParetoRequest::file)
      .def_readwrite("ctx", &ParetoRequest::ctx)
      .def_readwrite("chunks", &ParetoRequest::chunks)
      .def_readwrite("png", &ParetoRequest::png)
      .def_readwrite("json", &ParetoRequest::json);
}

}  // namespace

PYBIND11_MODULE(_woq, mod) {
  mod.doc() = "woq's C++ engine; use the woq package, which documents it";
  static py::exception<Error> error(mod, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(error.ptr(), e.what());
    } catch (const jinja::TemplateError& e) {  // the model's chat template failed on these messages
      PyErr_SetString(error.ptr(), fmt::format("the chat template: {}", e.what()).c_str());
    }
  });

  py::class_<LoadRequest>(mod, "LoadRequest")
      .def(py::init<>())
      .def_readwrite("low_bit", &LoadRequest::low_bit)
      .def_readwrite("group_size", &LoadRequest::group_size)
      .def_readwrite("int4_range", &LoadRequest::int4_range)
      .def_readwrite("rounding", &LoadRequest::rounding)
      .def_readwrite("lm_head_low_bit", &LoadRequest::lm_head_low_bit)
      .def_readwrite("activations", &LoadRequest::activations)
      .def_readwrite("numerics", &LoadRequest::numerics)
      .def_readwrite("plan", &LoadRequest::plan);

  py::class_<Penalties>(mod, "Penalties")
      .def(py::init<>())
      .def_readwrite("repeat", &Penalties::repeat)
      .def_readwrite("last_n", &Penalties::last_n)
      .def_readwrite("presence", &Penalties::presence)
      .def_readwrite("frequency", &Penalties::frequency);

  py::class_<Tokenizer, std::shared_ptr<Tokenizer>>(mod, "Tokenizer")
      .def("encode", &Tokenizer::encode, py::arg("text"), py::arg("add_special") = true)
      .def("encode_with_special", &Tokenizer::encode_with_special, py::arg("text"))
      .def("decode", [](const Tokenizer& t, const std::vector<std::int32_t>& ids) {
        for (const std::int32_t id : ids)
          if (id < 0 || id >= t.vocab_size())
            throw py::value_error("decode: id " + std::to_string(id) + " is outside the vocabulary");
        const std::string s = t.decode(ids);
        return py::bytes(s).attr("decode")("utf-8", "replace");
      })
      .def("token_text", &Tokenizer::token_text)
      .def_property_readonly("bos_id", &Tokenizer::bos_id)
      .def_property_readonly("eos_id", &Tokenizer::eos_id)
      .def_property_readonly("add_bos", &Tokenizer::add_bos)
      .def_property_readonly("vocab_size", &Tokenizer::vocab_size)
      .def("describe", &Tokenizer::describe);

  py::class_<Model>(mod, "Model")
      .def_readonly("path", &Model::path)
      .def_readonly("summary", &Model::summary)
      .def_property_readonly("tokenizer", [](const Model& m) { return m.tokenizer; })
      .def_property_readonly("low_bit", [](const Model& m) { return m.report.low_bit; })
      .def_property_readonly("label", [](const Model& m) { return m.report.label; })
      .def_property_readonly("threads", [](const Model& m) { return m.pool->size(); })
      .def_property_readonly("context_limit", [](const Model& m) { return m.model->context_limit(); })
      .def_property_readonly("config_json", [](const Model& m) { return hf_config_json(m.model->config(), "float32").dump(); })
      .def("generate", &generate, py::arg("prompt"), py::arg("max_new_tokens"), py::arg("temperature"),
           py::arg("top_k"), py::arg("top_p"), py::arg("seed"), py::arg("stop"), py::arg("penalties"),
           py::arg("on_text"), py::arg("keep_cache") = false)
      .def("logits", &logits, py::arg("ids"))
      .def("save_pretrained", &save_pretrained, py::arg("out_dir"), py::arg("force"))
      .def("chat_prompt", &chat_prompt, py::arg("messages_json"), py::arg("add_generation_prompt") = true);

  py::class_<ScoringRequest>(mod, "ScoringRequest")
      .def(py::init<>())
      .def_readwrite("ctx", &ScoringRequest::ctx)
      .def_readwrite("batch", &ScoringRequest::batch)
      .def_readwrite("chunks", &ScoringRequest::chunks)
      .def_readwrite("bos_per_chunk", &ScoringRequest::bos_per_chunk)
      .def_readwrite("per_document", &ScoringRequest::per_document);

  py::class_<TaskOptions>(mod, "TaskOptions")
      .def(py::init<>())
      .def_readwrite("shots", &TaskOptions::shots)
      .def_readwrite("limit", &TaskOptions::limit)
      .def_readwrite("seed", &TaskOptions::seed);

  py::class_<QuantizeRequest>(mod, "QuantizeRequest")
      .def(py::init<>())
      .def_readwrite("input", &QuantizeRequest::input)
      .def_readwrite("output", &QuantizeRequest::output)
      .def_readwrite("format", &QuantizeRequest::format)
      .def_readwrite("recipe", &QuantizeRequest::recipe)
      .def_readwrite("low_bit", &QuantizeRequest::low_bit)
      .def_readwrite("plan", &QuantizeRequest::plan)
      .def_readwrite("method", &QuantizeRequest::method)
      .def_readwrite("force", &QuantizeRequest::force)
      .def_readwrite("resume", &QuantizeRequest::resume)
      .def_readwrite("group_size", &QuantizeRequest::group_size)
      .def_readwrite("int4_range", &QuantizeRequest::int4_range)
      .def_readwrite("rounding", &QuantizeRequest::rounding)
      .def_readwrite("gptq_format", &QuantizeRequest::gptq_format)
      .def_readwrite("max_shard_gb", &QuantizeRequest::max_shard_gb)
      .def_readwrite("damp_percent", &QuantizeRequest::damp_percent)
      .def_readwrite("desc_act", &QuantizeRequest::desc_act)
      .def_readwrite("static_groups", &QuantizeRequest::static_groups)
      .def_readwrite("true_sequential", &QuantizeRequest::true_sequential)
      .def_readwrite("block_size", &QuantizeRequest::block_size)
      .def_readwrite("calib", &QuantizeRequest::calib)
      .def_readwrite("calib_file", &QuantizeRequest::calib_file)
      .def_readwrite("nsamples", &QuantizeRequest::nsamples)
      .def_readwrite("seqlen", &QuantizeRequest::seqlen)
      .def_readwrite("seed", &QuantizeRequest::seed)
      .def_readwrite("awq_grid", &QuantizeRequest::awq_grid)
      .def_readwrite("awq_clip", &QuantizeRequest::awq_clip)
      .def_readwrite("awq_search_tokens", &QuantizeRequest::awq_search_tokens)
      .def_readwrite("awq_propagate", &QuantizeRequest::awq_propagate);

  bind_plan_requests(mod);

  mod.def("load", &load, py::arg("path"), py::arg("request"), py::arg("threads"), py::arg("progress"));
  mod.def("quantize", &quantize, py::arg("request"), py::arg("threads"), py::arg("log"), py::arg("progress"));
  mod.def("plan_search", &plan_search, py::arg("request"), py::arg("threads"), py::arg("log"));
  mod.def("pareto", &pareto, py::arg("request"), py::arg("threads"), py::arg("log"));
  mod.def("perplexity", &perplexity, py::arg("model"), py::arg("text"), py::arg("source"), py::arg("request"),
          py::arg("progress"));
  mod.def("compare", &compare, py::arg("model"), py::arg("reference"), py::arg("text"), py::arg("source"),
          py::arg("request"), py::arg("progress"));
  mod.def("tasks", &tasks, py::arg("model"), py::arg("specs"), py::arg("data_dir"), py::arg("options"), py::arg("log"),
          py::arg("progress"));
  mod.def("recovery", &recovery, py::arg("baseline"), py::arg("variants"), py::arg("specs"), py::arg("data_dir"),
          py::arg("options"), py::arg("ppl_text"), py::arg("ppl_source"), py::arg("ctx"), py::arg("log"),
          py::arg("progress"));
  mod.def("explain", &explain, py::arg("original"), py::arg("quantized"), py::arg("prompt"), py::arg("max_new_tokens"),
          py::arg("top"));
  mod.attr("bundled_task_data_dir") = bundled_task_data_dir();
}

}  // namespace woq::python

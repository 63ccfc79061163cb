// woq._woq: the C++ engine for Python (pybind11). Thin: every call is one of
// the library calls the CLI makes (model/load_request.h, generate/generate.h,
// generate/chat_template.h, LlamaModel::forward, quantize_checkpoint);
// python/woq/__init__.py adds
// the docstrings, defaults and the streaming generator.
//
// Threads: every call that runs the model releases the GIL. generate() takes it
// back for each piece of text (to call the Python callback and to let a pending
// Ctrl-C raise KeyboardInterrupt, which ends generation; the model stays
// usable). One model runs one call at a time (a mutex); two models run in
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
#include "core/thread_pool.h"
#include "generate/chat_template.h"
#include "generate/generate.h"
#include "io/hf_config_writer.h"
#include "model/llama.h"
#include "model/load_request.h"
#include "quantize/quantize_checkpoint.h"
#include "tokenizer/tokenizer.h"

namespace py = pybind11;

namespace woq::python {

namespace {

// A loaded model with what runs it.
struct Model {
  std::string path;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<LlamaModel> model;
  std::shared_ptr<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;
  LoadOptions options;
  LoadReport report;
  std::vector<std::string> summary;  ///< notes, warnings and the load summary, as the CLI prints them
  std::mutex busy;
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

std::unique_ptr<Model> load(const std::string& path, const LoadRequest& request, int threads) {
  auto m = std::make_unique<Model>();
  m->path = path;
  m->options = argument_check([&] { return parse_load_request(request, &m->summary); });
  if (threads < 0) throw py::value_error("threads must be >= 0 (0 = all cores), got " + std::to_string(threads));
  py::gil_scoped_release unlocked;
  read_model_config(path);  // the plainest error for a wrong path comes first, as in the CLI
  m->tokenizer = std::make_shared<Tokenizer>(Tokenizer::load(path));
  m->chat_template = ChatTemplate::load(path);
  m->pool = std::make_unique<ThreadPool>(threads);
  m->model = LlamaModel::load(path, m->options, *m->pool, &m->report);
  for (std::string& line : load_summary(m->report, m->options)) m->summary.push_back(std::move(line));
  return m;
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
                  const std::optional<py::function>& on_text) {
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
  QuantizeOptions options;
  options.spec = m.options.linear;
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
                              describe(options.spec), r.matrices, r.seconds));
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

}  // namespace

PYBIND11_MODULE(_woq, mod) {
  mod.doc() = "woq's C++ engine; use the woq package, which documents it";
  static py::exception<Error> error(mod, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(error.ptr(), e.what());
    }
  });

  py::class_<LoadRequest>(mod, "LoadRequest")
      .def(py::init<>())
      .def_readwrite("low_bit", &LoadRequest::low_bit)
      .def_readwrite("group_size", &LoadRequest::group_size)
      .def_readwrite("int4_range", &LoadRequest::int4_range)
      .def_readwrite("rounding", &LoadRequest::rounding)
      .def_readwrite("lm_head_low_bit", &LoadRequest::lm_head_low_bit)
      .def_readwrite("activations", &LoadRequest::activations);

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
           py::arg("on_text"))
      .def("logits", &logits, py::arg("ids"))
      .def("save_pretrained", &save_pretrained, py::arg("out_dir"), py::arg("force"))
      .def("chat_prompt", &chat_prompt, py::arg("messages_json"), py::arg("add_generation_prompt") = true);

  mod.def("load", &load, py::arg("path"), py::arg("request"), py::arg("threads"));
}

}  // namespace woq::python

#include "generate/decode_step.h"

#include <algorithm>

namespace woq {

DecodeStep::DecodeStep(const Tokenizer& tokenizer, DecodeOptions options, std::span<const std::int32_t> prompt)
    : options_(std::move(options)), sampler_(options_.sampling), stream_(tokenizer), filter_(options_.stop_strings) {
  validate(options_.penalties);
  const Penalties openai{.repeat = 1.0f, .last_n = 1, .presence = options_.presence_penalty,
                         .frequency = options_.frequency_penalty};
  validate(openai);
  stream_.set_context(std::vector<std::int32_t>(prompt.begin(), prompt.end()));
  if (options_.penalties.active()) window_.assign(prompt.begin(), prompt.end());
}

DecodeStep::Token DecodeStep::next(std::span<const float> logits) {
  std::span<const float> row = logits;
  const bool openai = (options_.presence_penalty != 0 || options_.frequency_penalty != 0) && !counts_.empty();
  if (options_.penalties.active() || openai) {
    penalized_.assign(logits.begin(), logits.end());
    apply_penalties(penalized_, window_, options_.penalties);
    if (openai) apply_penalties(penalized_, counts_, options_.presence_penalty, options_.frequency_penalty);
    row = penalized_;
  }
  const std::int32_t id = sampler_.sample(row);
  if (std::find(options_.stop_ids.begin(), options_.stop_ids.end(), id) != options_.stop_ids.end())
    return {id, true, {}};
  ++generated_;
  if (options_.penalties.active()) window_.push_back(id);
  if (id >= 0 && static_cast<std::size_t>(id) < logits.size()) {
    if (count_at_.size() <= static_cast<std::size_t>(id)) count_at_.resize(logits.size(), 0);
    std::size_t& at = count_at_[static_cast<std::size_t>(id)];
    if (at == 0) {
      counts_.emplace_back(id, 0);
      at = counts_.size();
    }
    ++counts_[at - 1].second;
  }
  return {id, false, filter_.push(stream_.push(id))};
}

std::string DecodeStep::finish() {
  std::string text = filter_.push(stream_.flush());
  if (!filter_.stopped()) text += filter_.flush();
  return text;
}

}  // namespace woq

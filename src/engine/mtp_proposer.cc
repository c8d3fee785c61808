#include "engine/mtp_proposer.h"

#include <algorithm>

#include "base/check.h"

namespace dserve {

MtpProposer::MtpProposer(CausalLm& model, int n_drafts, int block_size, int max_model_len)
    : model_(model), n_drafts_(n_drafts), block_size_(block_size), max_model_len_(max_model_len) {}

void MtpProposer::argmax_rows(size_t n_rows, std::vector<int32_t>* out) const {
  const int64_t vocab = model_.info().vocab_size;
  out->resize(n_rows);
  for (size_t r = 0; r < n_rows; ++r) {
    const float* row = logits_.data() + r * vocab;
    (*out)[r] = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
  }
}

Status MtpProposer::propose(const sched::SchedulerOutput& plan, const StepView& step,
                            std::span<const std::vector<int32_t>> emitted,
                            std::span<const int32_t> next_prompt_token, PagedCache& cache,
                            std::vector<std::vector<int32_t>>* drafts) {
  const size_t n_req = plan.requests.size();
  drafts->assign(n_req, {});
  tokens_.clear();
  positions_.clear();
  seq_.clear();
  rows_.clear();
  logits_rows_.clear();
  std::vector<size_t> drafting;   // plan indices that get drafts, in logits-row order
  std::vector<int32_t> last_pos;  // each one's last MTP position this pass
  // 1. Every position whose next token is known: (next token, target row, position).
  for (size_t i = 0; i < n_req; ++i) {
    const sched::ScheduledRequest& r = plan.requests[i];
    const int n_known = r.n_tokens;
    const int n_accepted = r.sample ? static_cast<int>(emitted[i].size()) - 1 : 0;
    DS_CHECK(!r.sample || !emitted[i].empty());
    const int first = step.first_token[i];
    for (int j = 0; j < n_known + n_accepted; ++j) {
      int32_t next;
      if (j + 1 < n_known) {
        next = step.tokens[first + j + 1];
      } else if (r.sample) {
        next = emitted[i][j - (n_known - 1)];
      } else {
        next = next_prompt_token[i];
      }
      tokens_.push_back(next);
      positions_.push_back(step.positions[first + j]);
      seq_.push_back(step.seq_of_token[first + j]);
      rows_.push_back(first + j);
    }
    if (r.sample) {
      drafting.push_back(i);
      last_pos.push_back(r.start_pos + n_known - 1 + n_accepted);
      logits_rows_.push_back(static_cast<int32_t>(tokens_.size()) - 1);
    }
  }
  if (tokens_.empty()) return Status::Ok();
  ModelBatch pass{tokens_, positions_, seq_, step.block_tables, step.block_table_offsets,
                  logits_rows_, {}};
  DS_RETURN_IF_ERROR(model_.forward_mtp(pass, cache, rows_, /*prev_is_target=*/true, &logits_));
  std::vector<int32_t> next;
  argmax_rows(drafting.size(), &next);
  for (size_t d = 0; d < drafting.size(); ++d) (*drafts)[drafting[d]].push_back(next[d]);

  // 2. The chain: one token per request that still has a slot for its next position.
  std::vector<int32_t> prev_row(logits_rows_);  // each drafting request's row in the last pass
  std::vector<size_t> active(drafting.size());
  for (size_t d = 0; d < active.size(); ++d) active[d] = d;
  for (int k = 1; k < n_drafts_; ++k) {
    tokens_.clear();
    positions_.clear();
    seq_.clear();
    rows_.clear();
    logits_rows_.clear();
    tables_.clear();
    offsets_.assign(1, 0);
    std::vector<size_t> still;
    for (size_t d : active) {
      const size_t i = drafting[d];
      const int32_t pos = last_pos[d] + k;
      const int64_t table_begin = step.block_table_offsets[step.seq_of_token[step.first_token[i]]];
      const int64_t table_end = step.block_table_offsets[step.seq_of_token[step.first_token[i]] + 1];
      // The slot of `pos` must exist, and the token it predicts fit in max_model_len.
      if (pos / block_size_ >= table_end - table_begin || pos + 2 >= max_model_len_) continue;
      tokens_.push_back((*drafts)[i].back());
      positions_.push_back(pos);
      seq_.push_back(static_cast<int32_t>(offsets_.size()) - 1);
      rows_.push_back(prev_row[d]);
      logits_rows_.push_back(static_cast<int32_t>(tokens_.size()) - 1);
      tables_.insert(tables_.end(), step.block_tables.begin() + table_begin,
                     step.block_tables.begin() + table_end);
      offsets_.push_back(static_cast<int64_t>(tables_.size()));
      still.push_back(d);
    }
    if (still.empty()) break;
    ModelBatch chain{tokens_, positions_, seq_, tables_, offsets_, logits_rows_, {}};
    DS_RETURN_IF_ERROR(model_.forward_mtp(chain, cache, rows_, /*prev_is_target=*/false, &logits_));
    argmax_rows(still.size(), &next);
    for (size_t j = 0; j < still.size(); ++j) {
      (*drafts)[drafting[still[j]]].push_back(next[j]);
      prev_row[still[j]] = static_cast<int32_t>(j);
    }
    active.swap(still);
  }
  return Status::Ok();
}

}  // namespace dserve

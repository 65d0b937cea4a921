"""The draft recipe's pure pieces (mdv.distill): the distillation loss over a full or a
subset head, the centred-logit Gram identity, the head-subset ranking and the early option checks.
The recipe itself needs the target file and hours of CPU; its output is measured in draft_report.json."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from mdv.distill import head_subset, recipe, teacher
from mdv.errors import InvalidInputError

REPO_CONF = "mdv/conf/train_draft.yaml"


def _states(n: int = 6, d: int = 5, V: int = 11, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    head = torch.randn(V, d, generator=g, dtype=torch.float64)
    return (torch.randn(n, d, generator=g, dtype=torch.float64), torch.randn(n, d, generator=g, dtype=torch.float64),
            head)


def test_centered_gram_is_the_mean_squared_centred_logit_difference():
    a, b, head = _states()
    gram = teacher.centered_gram(head).double()
    la, lb = a @ head.T, b @ head.T
    centred = (la - la.mean(-1, keepdim=True)) - (lb - lb.mean(-1, keepdim=True))
    want = (centred ** 2).mean(-1)
    got = (((a - b) @ gram) * (a - b)).sum(-1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("subset", [None, [0, 3, 4, 9]])
def test_distill_loss_is_the_kl_over_the_given_head_rows(subset):
    hd, ht, head = _states()
    rows_head = head if subset is None else head[subset]
    gram = teacher.centered_gram(head).double()
    temperature, kl_rows = 0.7, torch.tensor([0, 2, 5])
    loss, stats = teacher.distill_loss(hd, ht, rows_head, gram, temperature, kl_rows, mse_weight=0.0)
    p = torch.softmax(ht[kl_rows] @ rows_head.T / temperature, -1)  # teacher law on these rows only
    q = torch.softmax(hd[kl_rows] @ rows_head.T / temperature, -1)
    want = (p * (p.log() - q.log())).sum(-1).mean()
    torch.testing.assert_close(loss, want)
    assert stats["kl"] == pytest.approx(float(want))
    assert stats["top1"] == pytest.approx(float((p.argmax(-1) == q.argmax(-1)).double().mean()))


def test_distill_loss_without_kl_rows_is_the_weighted_mse():
    hd, ht, head = _states()
    gram = teacher.centered_gram(head).double()
    loss, stats = teacher.distill_loss(hd, ht, head, gram, 1.0, torch.empty(0, dtype=torch.long), mse_weight=0.5)
    d = hd - ht
    torch.testing.assert_close(loss, 0.5 * ((d @ gram) * d).sum(-1).mean())
    assert "kl" not in stats


def test_distill_loss_is_zero_when_draft_equals_teacher():
    _, ht, head = _states()
    loss, stats = teacher.distill_loss(ht.clone(), ht, head, teacher.centered_gram(head).double(), 1.0, torch.arange(6), 1.0)
    assert abs(float(loss)) < 1e-12 and stats["top1"] == 1.0


def test_head_ranking_puts_always_ids_first_then_mixed_frequency_then_unseen_by_id():
    from collections import Counter

    gen = Counter({5: 3, 7: 1})            # relative 0.75, 0.25
    text = Counter({7: 1, 2: 1, 9: 2})     # relative 0.25, 0.25, 0.5
    ranking = head_subset.head_ranking(gen, text, vocab_size=10, generation_weight=0.5, always=[8, 5])
    # scores: 5 -> 0.375, 7 -> 0.25, 9 -> 0.25, 2 -> 0.125 (ties by id)
    assert ranking == [8, 5, 7, 9, 2, 0, 1, 3, 4, 6]


def _cfg(**overrides):
    cfg = OmegaConf.load(REPO_CONF)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def test_shipped_config_passes_the_option_checks():
    recipe.check_options(_cfg())


@pytest.mark.parametrize("overrides, message", [
    ({"distill.head": "rows"}, r"distill.head must be one of subset, full; got 'rows'"),
    ({"head_subset.enabled": False}, r"distill.head=subset needs head_subset.enabled=true"),
    ({"gen.dtype": "int8"}, r"gen.dtype must be one of float32, bfloat16, float16; got 'int8'"),
    ({"train.autocast": "float16"}, r"train.autocast must be one of null, bfloat16; got 'float16'"),
    ({"gen.samples_per_prompt": 0}, r"gen.samples_per_prompt must be an integer >= 1; got 0"),
    ({"gen.samples_per_prompt": "two"}, r"gen.samples_per_prompt must be an integer >= 1; got 'two'"),
    ({"data.num_reference": -1}, r"data.num_reference must be an integer >= 0 or null \(all\); got -1"),
    ({"data.num_raw_code": "all"}, r"data.num_raw_code must be an integer >= 0 or null \(all\); got 'all'"),
    ({"head_subset.size": 0}, r"head_subset.size must be an integer >= 1; got 0"),
    ({"head_subset.sizes": [2048, 0]}, r"head_subset.sizes must be a list of integers >= 1; got \[2048, 0\]"),
    ({"head_subset.sizes": 4096}, r"head_subset.sizes must be a list of integers >= 1; got 4096"),
    ({"gen.temperature": 0.0, "gen.samples_per_prompt": 2}, r"gen.samples_per_prompt > 1 needs gen.temperature > 0 .* set gen.samples_per_prompt=1"),
])
def test_bad_recipe_options_fail_before_any_work(overrides, message):
    with pytest.raises(InvalidInputError, match=message):
        recipe.check_options(_cfg(**overrides))


def test_greedy_generation_is_accepted_with_one_sample_per_prompt():
    recipe.check_options(_cfg(**{"gen.temperature": 0.0, "gen.samples_per_prompt": 1}))


def test_full_head_distillation_needs_no_subset():
    recipe.check_options(_cfg(**{"distill.head": "full", "head_subset.enabled": False}))


def test_warmup_cosine_schedule():
    from mdv.distill.train import warmup_cosine

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = warmup_cosine(opt, steps=12, warmup=4, min_lr_ratio=0.1)
    lrs = []
    for _ in range(13):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(0.5) and lrs[3] == pytest.approx(2.0)  # linear rise to lr
    assert lrs[4] == pytest.approx(2.0) and lrs[8] == pytest.approx(2.0 * 0.55)  # half way down the cosine
    assert lrs[12] == pytest.approx(0.2) and all(a >= b for a, b in zip(lrs[3:], lrs[4:]))

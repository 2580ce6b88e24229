"""Train the Transformer: ``python -m model.train --data DIR --out DIR``.

Label-smoothed cross-entropy, Adam with the paper's warm-up / inverse square
root schedule (section 5.3), gradient clipping, dropout; optional decoupled
weight decay (AdamW) and R-Drop consistency (Liang et al. 2021); validation
loss and BLEU every epoch; best-checkpoint keep, averaging of the last epochs,
resume, and a wall-clock budget (``--max-minutes``, checked between epochs).
Several processes through ``torchrun`` (DistributedDataParallel; gloo on CPU,
nccl on CUDA).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sacrebleu
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from common import flags
from common.corpus import corpus_path, read_parallel
from common.flags import setting
from model.checkpoint import SPM_FILE, WEIGHTS_FILE, average_weights, load_checkpoint, save_checkpoint
from model.data import Example, filter_by_length, iterate_batches
from model.transformer import Transformer
from model.translate import TorchTranslator
from runtime.model_config import ModelConfig
from runtime.tokenizer import Tokenizer

# The defaults of the default model (model/default): narrower and more dropout than ModelConfig's,
# for 29k training pairs.
DEFAULT_MODEL = ModelConfig(vocab_size=6000, d_ff=512, dropout=0.2)


@dataclass(frozen=True)
class TrainConfig:
    data: Path = setting(help="corpus folder (Multi30k's layout: SPLIT.LANG.gz)")
    out: Path = setting(help="run folder: checkpoints, log, the final model")
    model: ModelConfig = setting(help="the architecture (its fields are flags)", factory=lambda: DEFAULT_MODEL)
    src_lang: str = setting("en", "source language")
    tgt_lang: str = setting("de", "target language")
    train_split: str = setting("train", "training split")
    valid_split: str = setting("val", "validation split")
    max_len: int = setting(100, "training pairs longer than this many tokens on either side are left out")
    max_tokens: int = setting(2500, "tokens per batch (source and target, padded)")
    epochs: int = setting(20, "epochs")
    max_steps: int = setting(0, "stop after this many steps (0: no limit)")
    max_minutes: float = setting(0.0, "stop after the epoch that passes this much training time (0: no limit)")
    lr: float = setting(1e-3, "peak learning rate, reached after --warmup steps (equation 3)")
    warmup: int = setting(1000, "warm-up steps")
    label_smoothing: float = setting(0.1, "label smoothing (section 5.4)")
    weight_decay: float = setting(0.0, "decoupled weight decay (AdamW) when above 0")
    r_drop: float = setting(0.0, "weight of R-Drop's symmetric KL between two dropout passes (0: off)")
    clip_norm: float = setting(1.0, "gradient norm clipping")
    average: int = setting(5, "average the weights of the last this many epochs (against the best epoch)")
    valid_bleu_sentences: int = setting(0, "validation sentences for BLEU each epoch (0: all)")
    seed: int = setting(1, "random seed")
    device: str = setting("cpu", "torch device")
    threads: int = setting(0, "torch threads (0: torch's default)")
    resume: bool = setting(False, "continue the run in --out")
    limit_train: int = setting(0, "use only the first this many training pairs (0: all)")
    name: str = setting("", "the model's name in checkpoints and the server (default: SRC-TGT-transformer)")


def parse_args(argv: Sequence[str] | None) -> TrainConfig:
    return flags.command(TrainConfig, argv, "python -m model.train", __doc__)


def learning_rate(step: int, peak: float, warmup: int) -> float:
    """lrate ∝ min(step^-0.5, step · warmup^-1.5)  (equation 3), scaled to reach ``peak`` at warmup."""
    step = max(step, 1)
    return peak * min(step / warmup, math.sqrt(warmup / step))


def label_smoothed_nll(logits: torch.Tensor, target: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed loss (Szegedy et al. 2016) and summed NLL of logits (N, V) against target (N,)."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    nll = -log_probs.gather(1, target[:, None]).squeeze(1)
    smooth = -log_probs.mean(dim=-1)
    return ((1.0 - epsilon) * nll + epsilon * smooth).sum(), nll.sum()


def symmetric_kl(logits_a: torch.Tensor, logits_b: torch.Tensor) -> torch.Tensor:
    """Summed ½(KL(p_a‖p_b) + KL(p_b‖p_a)) over rows of logits (N, V): R-Drop's consistency term."""
    log_a, log_b = torch.log_softmax(logits_a.float(), dim=-1), torch.log_softmax(logits_b.float(), dim=-1)
    return 0.5 * ((log_a.exp() - log_b.exp()) * (log_a - log_b)).sum()


class Trainer:
    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.device = torch.device(cfg.device)
        if self.world_size > 1:
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
            if self.device.type == "cuda":
                self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.work = cfg.out / "work"
        self.tokenizer, self.spm_model = self._tokenizer()
        self.train_set, self.valid_set, self.valid_text = self._data()
        special = self.tokenizer.special_ids
        self.model_config = dataclasses.replace(
            cfg.model,
            vocab_size=self.tokenizer.vocab_size,
            pad_id=special.pad,
            unk_id=special.unk,
            bos_id=special.bos,
            eos_id=special.eos,
            decoder_start_id=special.bos,
        )
        self.model = Transformer(self.model_config).to(self.device)
        self.ddp = DistributedDataParallel(self.model) if self.world_size > 1 else self.model
        if cfg.weight_decay:
            self.optimizer: torch.optim.Optimizer = torch.optim.AdamW(
                self.model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=cfg.weight_decay
            )
        else:
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9)
        self.train_seconds = 0.0
        self.step, self.epoch, self.best_bleu = 0, 0, -1.0
        if cfg.resume:
            self._load_state()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _tokenizer(self) -> tuple[Tokenizer, bytes]:
        path = self.work / SPM_FILE
        if self.is_main and not path.exists():
            src, tgt = read_parallel(*self._paths(self.cfg.train_split))
            _, blob = Tokenizer.train(src + tgt, self.cfg.model.vocab_size)
            self.work.mkdir(parents=True, exist_ok=True)
            path.write_bytes(blob)
        if self.world_size > 1:
            dist.barrier()  # every rank waits for rank 0's tokenizer
        return Tokenizer.from_file(path), path.read_bytes()

    def _paths(self, split: str) -> tuple[Path, Path]:
        return corpus_path(self.cfg.data, split, self.cfg.src_lang), corpus_path(
            self.cfg.data, split, self.cfg.tgt_lang
        )

    def _data(self) -> tuple[list[Example], list[Example], tuple[list[str], list[str]]]:
        def encode(split: str, limit: int) -> tuple[list[Example], list[str], list[str]]:
            src, tgt = read_parallel(*self._paths(split))
            if limit:
                src, tgt = src[:limit], tgt[:limit]
            pairs = filter_by_length(
                self.tokenizer.encode_source(src), self.tokenizer.encode_target(tgt), self.cfg.max_len
            )
            return pairs, src, tgt

        train, _, _ = encode(self.cfg.train_split, self.cfg.limit_train)
        valid, valid_src, valid_ref = encode(self.cfg.valid_split, self.cfg.valid_bleu_sentences)
        return train, valid, (valid_src, valid_ref)

    # --- state -------------------------------------------------------------------

    def _save_state(self) -> None:
        """Everything needed to resume, without pickles: tensors in safetensors, scalars in JSON."""
        state_dir = self.work / "last"
        save_checkpoint(state_dir, self.model, self.spm_model)
        tensors, params = {}, dict(self.model.named_parameters())
        for name, p in params.items():
            for key, value in self.optimizer.state.get(p, {}).items():
                if torch.is_tensor(value) and value.dim() > 0:
                    tensors[f"{key}/{name}"] = value.contiguous()
        tensors["rng/torch"] = torch.get_rng_state()
        save_file(tensors, str(state_dir / "optimizer.safetensors"))
        scalars = {
            "step": self.step,
            "epoch": self.epoch,
            "best_bleu": self.best_bleu,
            "train_seconds": self.train_seconds,
        }
        (state_dir / "trainer.json").write_text(json.dumps(scalars))

    def _load_state(self) -> None:
        state_dir = self.work / "last"
        if not (state_dir / "trainer.json").exists():
            raise FileNotFoundError(f"--resume: no saved state in {state_dir}; run without --resume to start")
        self.model.load_state_dict(load_checkpoint(state_dir, str(self.device))[0].state_dict())
        scalars = json.loads((state_dir / "trainer.json").read_text())
        self.step, self.epoch, self.best_bleu = scalars["step"], scalars["epoch"], scalars["best_bleu"]
        self.train_seconds = scalars.get("train_seconds", 0.0)
        tensors = load_file(str(state_dir / "optimizer.safetensors"))
        torch.set_rng_state(tensors.pop("rng/torch"))
        params = dict(self.model.named_parameters())
        for key_name, value in tensors.items():
            key, name = key_name.split("/", 1)
            state = self.optimizer.state[params[name]]
            state[key] = value.to(self.device)
            state["step"] = torch.tensor(float(self.step))

    # --- loop --------------------------------------------------------------------

    def batches(self, examples: list[Example], seed: int | None):
        s = self.tokenizer.special_ids
        return iterate_batches(examples, self.cfg.max_tokens, (s.pad, s.bos, s.eos), seed, self.rank, self.world_size)

    def train_epoch(self) -> dict[str, float]:
        self.ddp.train()
        total_loss = total_tokens = 0.0
        start = time.perf_counter()
        batches = list(self.batches(self.train_set, seed=self.cfg.seed + self.epoch))
        bar = tqdm(batches, desc=f"epoch {self.epoch + 1}", disable=not self.is_main, mininterval=2.0, file=sys.stderr)
        for batch in bar:
            batch = batch.to(self.device)
            select = batch.tgt_out != self.model_config.pad_id
            loss = self.loss(batch, select)
            tokens = int(select.sum())
            self.step += 1
            for group in self.optimizer.param_groups:
                group["lr"] = learning_rate(self.step, self.cfg.lr, self.cfg.warmup)
            self.optimizer.zero_grad(set_to_none=True)
            (loss / tokens).backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
            self.optimizer.step()
            total_loss += loss.item()
            total_tokens += tokens
            elapsed = time.perf_counter() - start
            bar.set_postfix(
                loss=f"{total_loss / total_tokens:.3f}", tok_s=f"{total_tokens * self.world_size / elapsed:.0f}"
            )
            if self.cfg.max_steps and self.step >= self.cfg.max_steps:
                break
        elapsed = time.perf_counter() - start
        return {
            "train_loss": total_loss / max(total_tokens, 1),
            "train_seconds": elapsed,
            "tokens_per_second": total_tokens * self.world_size / elapsed,
        }

    def loss(self, batch, select: torch.Tensor) -> torch.Tensor:
        """Summed label-smoothed loss; with R-Drop, the mean over two dropout passes plus α · their symmetric KL."""
        target = batch.tgt_out[select]
        logits = self.ddp(batch.src, batch.src_mask, batch.tgt_in, select)
        loss, _ = label_smoothed_nll(logits, target, self.cfg.label_smoothing)
        if not self.cfg.r_drop:
            return loss
        again = self.ddp(batch.src, batch.src_mask, batch.tgt_in, select)
        loss_again, _ = label_smoothed_nll(again, target, self.cfg.label_smoothing)
        return 0.5 * (loss + loss_again) + self.cfg.r_drop * symmetric_kl(logits, again)

    @torch.no_grad()
    def validate(self, model: Transformer) -> dict[str, float]:
        model.eval()
        nll = tokens = 0.0
        for batch in self.batches(self.valid_set, seed=None):
            batch = batch.to(self.device)
            select = batch.tgt_out != self.model_config.pad_id
            _, batch_nll = label_smoothed_nll(
                model(batch.src, batch.src_mask, batch.tgt_in, select), batch.tgt_out[select], 0.0
            )
            nll += float(batch_nll)
            tokens += int(select.sum())
        hypotheses = TorchTranslator(model, self.tokenizer).translate(self.valid_text[0], beam=1)
        bleu = sacrebleu.corpus_bleu(hypotheses, [self.valid_text[1]]).score
        return {"valid_nll": nll / tokens, "valid_bleu": bleu}

    def log(self, record: dict) -> None:
        with open(self.cfg.out / "train_log.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        print(json.dumps(record), file=sys.stderr, flush=True)

    def run(self) -> None:
        self.cfg.out.mkdir(parents=True, exist_ok=True)
        epochs_dir = self.work / "epochs"
        if self.is_main:
            n = self.model.num_parameters()
            print(f"{n / 1e6:.2f}M parameters, {len(self.train_set)} training pairs", file=sys.stderr)
        while self.epoch < self.cfg.epochs and not (self.cfg.max_steps and self.step >= self.cfg.max_steps):
            if self._out_of_time():
                break
            record = self.train_epoch()
            self.train_seconds += record["train_seconds"]
            self.epoch += 1
            if not self.is_main:
                continue
            record.update(epoch=self.epoch, step=self.step, **self.validate(self.model))
            self.log(record)
            save_checkpoint(epochs_dir / f"epoch_{self.epoch:03d}", self.model, self.spm_model)
            for old in sorted(epochs_dir.glob("epoch_*"))[: -self.cfg.average]:
                shutil.rmtree(old)
            if record["valid_bleu"] > self.best_bleu:
                self.best_bleu = record["valid_bleu"]
                save_checkpoint(self.work / "best", self.model, self.spm_model)
            self._save_state()
        if self.is_main:
            self.finish(sorted(epochs_dir.glob("epoch_*")))
        if self.world_size > 1:
            # Every rank leaves together: one that tore its group down while rank 0 still validated died of
            # SIGABRT ("terminate called without an active exception") about once in a loaded suite.
            dist.barrier()
            dist.destroy_process_group()

    def _out_of_time(self) -> bool:
        """Whether the training-time budget is spent; every rank follows rank 0's clock."""
        spent = torch.tensor(float(self.cfg.max_minutes and self.train_seconds >= 60 * self.cfg.max_minutes))
        if self.world_size > 1:
            dist.broadcast(spent := spent.to(self.device), src=0)
        return bool(spent)

    def finish(self, last_epochs: list[Path]) -> None:
        """Average the last epochs; keep whichever of average and best validates better."""
        averaged = Transformer(self.model_config).to(self.device)
        averaged.load_state_dict(average_weights(last_epochs), strict=False)
        scores = self.validate(averaged)
        choice, source = (averaged, "average") if scores["valid_bleu"] >= self.best_bleu else (None, "best")
        if choice is None:
            choice = load_checkpoint(self.work / "best", str(self.device))[0]
        summary = {
            "selected": source,
            "averaged_epochs": [p.name for p in last_epochs],
            "averaged_valid_bleu": scores["valid_bleu"],
            "best_valid_bleu": self.best_bleu,
            "steps": self.step,
            "epochs": self.epoch,
        }
        self.log({"final": summary})
        meta = {
            "name": self.cfg.name or f"{self.cfg.src_lang}-{self.cfg.tgt_lang}-transformer",
            "source_language": self.cfg.src_lang,
            "target_language": self.cfg.tgt_lang,
            "training": {
                "command": "python -m model.train " + shlex.join(sys.argv[1:]),
                **summary,
                "config": {k: v if isinstance(v, dict) else str(v) for k, v in dataclasses.asdict(self.cfg).items()},
            },
        }
        save_checkpoint(self.cfg.out, choice, self.spm_model, meta)
        assert (self.cfg.out / WEIGHTS_FILE).exists()


def main(argv: Sequence[str] | None = None) -> int:
    Trainer(parse_args(argv)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())

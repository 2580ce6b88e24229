"""The encoder-decoder Transformer (Vaswani et al. 2017, figure 1).

``encode`` and ``decode_step`` are separate public methods: the server runs
them as two ONNX graphs. ``decode_step`` is written for a batch whose rows have
different histories: every row carries its own position and a validity mask
over its cached keys/values, so a row can join with an empty cache.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from model.attention import causal_mask
from model.layers import DecoderLayer, EncoderLayer
from model.positional import sinusoidal_encoding
from runtime.model_config import ModelConfig


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_id)
        self.encoder_layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_decoder_layers))
        pre_norm = config.norm == "pre"
        self.encoder_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if pre_norm else nn.Identity()
        self.decoder_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if pre_norm else nn.Identity()
        self.dropout = nn.Dropout(config.dropout)
        self.output = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_output:
            self.output.weight = self.embedding.weight
        self.final_logits_bias = nn.Parameter(torch.zeros(config.vocab_size), requires_grad=False)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embeddings else 1.0
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        nn.init.normal_(self.embedding.weight, std=self.config.d_model**-0.5)
        with torch.no_grad():
            self.embedding.weight[self.config.pad_id].zero_()

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """Embedding · √d_model + PE (section 3.4, 3.5)."""
        pe = sinusoidal_encoding(positions, self.config.d_model, self.config.positions)
        return self.dropout(self.embedding(tokens) * self.embed_scale + pe.to(self.embedding.weight.dtype))

    def logits(self, h: Tensor) -> Tensor:
        logits = self.output(self.decoder_norm(h))
        return logits + self.final_logits_bias if self.config.final_logits_bias else logits

    # --- encoder ---------------------------------------------------------------

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """Encoder output (B, S, D) of token ids src (B, S); src_mask (B, S) is True on real tokens."""
        positions = torch.arange(src.size(1), device=src.device).expand_as(src)
        x = self.embed(src, positions)
        attn_mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        for layer in self.encoder_layers:
            x = layer(x, attn_mask)
        return self.encoder_norm(x)

    def cross_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys and values of every decoder layer, each (L, B, H, S, d_k)."""
        kvs = [layer.cross_attn.project_memory(memory) for layer in self.decoder_layers]
        return torch.stack([k for k, _ in kvs]), torch.stack([v for _, v in kvs])

    # --- decoder ---------------------------------------------------------------

    def decode(self, tgt: Tensor, memory: Tensor, src_mask: Tensor, select: Tensor | None = None) -> Tensor:
        """Teacher-forced logits (B, T, V) for target inputs tgt (B, T), all positions at once;
        with a boolean ``select`` (B, T), only the logits of the selected positions (N, V)."""
        positions = torch.arange(tgt.size(1), device=tgt.device).expand_as(tgt)
        x = self.embed(tgt, positions)
        self_mask = causal_mask(tgt.size(1), tgt.device)  # (T, T)
        memory_mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        cross_k, cross_v = self.cross_kv(memory)
        for i, layer in enumerate(self.decoder_layers):
            x, _ = layer(x, self_mask, (cross_k[i], cross_v[i]), memory_mask)
        return self.logits(x if select is None else x[select])

    def forward(self, src: Tensor, src_mask: Tensor, tgt: Tensor, select: Tensor | None = None) -> Tensor:
        return self.decode(tgt, self.encode(src, src_mask), src_mask, select)

    def alignment(self, src: Tensor, src_mask: Tensor, tgt: Tensor) -> Tensor:
        """Cross-attention probabilities of every decoder layer, averaged over heads: (L, B, T, S).

        Teacher-forced over target inputs tgt (B, T) (the start token, then the output): row t is
        where the step that predicted output token t+1 looked in the source. The server places markup
        and placeholders with them (server/documents/markup.py); the ONNX aligner graph (export/aligner.py)
        is checked against this.
        """
        memory = self.encode(src, src_mask)
        positions = torch.arange(tgt.size(1), device=tgt.device).expand_as(tgt)
        x = self.embed(tgt, positions)
        self_mask = causal_mask(tgt.size(1), tgt.device)
        memory_mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        cross_k, cross_v = self.cross_kv(memory)
        layers = []
        for i, layer in enumerate(self.decoder_layers):
            attention = layer.cross_attn

            def cross(h: Tensor, attention=attention, i=i) -> Tensor:
                q = attention.split_heads(attention.q_proj(h))  # (B, H, T, d_k)
                scores = q @ cross_k[i].transpose(-2, -1) / math.sqrt(q.size(-1))
                weights = torch.softmax(scores.masked_fill(~memory_mask, torch.finfo(scores.dtype).min), dim=-1)
                layers.append(weights.mean(dim=1))
                return attention.out_proj(attention.merge_heads(weights @ cross_v[i]))

            x = layer.self_block(x, lambda h, layer=layer: layer.self_attn(h, self_mask)[0])
            x = layer.cross_block(x, cross)
            x = layer.ffn_block(x, layer.ffn)
        return torch.stack(layers)

    def decode_step(
        self,
        tokens: Tensor,
        positions: Tensor,
        past_k: Tensor,
        past_v: Tensor,
        cache_mask: Tensor,
        cross_k: Tensor,
        cross_v: Tensor,
        src_mask: Tensor,
        source_index: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One decoder step for B rows, each with its own history.

        tokens (B,) last token ids; positions (B,) each row's target position;
        past_k / past_v (L, B, H, T, d_k) cached self-attention keys/values;
        cache_mask (B, T) True on valid cache slots (rows may have different
        lengths, T may be 0); cross_k / cross_v (L, N, H, S, d_k) and src_mask
        (N, S) per *source*; source_index (B,) the source of each row, so a
        request's beams share one copy of its cross-attention keys/values.

        Returns log-probabilities (B, V) and the new keys/values (L, B, H, 1, d_k).
        """
        x = self.embed(tokens[:, None], positions[:, None])  # (B, 1, D)
        valid = torch.ones_like(tokens[:, None], dtype=torch.bool)  # the new token itself
        self_mask = torch.cat([cache_mask, valid], dim=1)[:, None, None, :]  # (B, 1, 1, T+1)
        memory_mask = src_mask.index_select(0, source_index)[:, None, None, :]  # (B, 1, 1, S)
        new_k, new_v = [], []
        for i, layer in enumerate(self.decoder_layers):
            memory_kv = (cross_k[i].index_select(0, source_index), cross_v[i].index_select(0, source_index))
            x, (k, v) = layer(x, self_mask, memory_kv, memory_mask, past=(past_k[i], past_v[i]))
            new_k.append(k)
            new_v.append(v)
        log_probs = torch.log_softmax(self.logits(x[:, 0]).float(), dim=-1)  # (B, V)
        return log_probs, torch.stack(new_k), torch.stack(new_v)

    def empty_cache(self, batch: int, device: torch.device | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention cache with no entries: past_k, past_v (L, B, H, 0, d_k), mask (B, 0)."""
        c = self.config
        shape = (c.n_decoder_layers, batch, c.n_heads, 0, c.d_head)
        dtype = self.embedding.weight.dtype
        empty = torch.zeros(shape, device=device, dtype=dtype)
        return empty, empty.clone(), torch.zeros(batch, 0, dtype=torch.bool, device=device)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

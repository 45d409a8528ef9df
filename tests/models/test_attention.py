"""The redirect edit (`redirect_sink_attention`) computed from the scores (`SinkAttention.redirected`): against a
float64 redirect for every registered attention kind under sink leads where float32 attention is exactly zero off the
sink, the built-in check against A's own rescaling, and end to end through `intervene` on a head built to have such
a lead."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from tests.helpers.strong_sink import cls_sink_vit, final_patch_relrms_with, rescaled
from vitsinks.backbones import adapt
from vitsinks.configs.schema import InterveneConfig
from vitsinks.interventions import intervene
from vitsinks.interventions.edits import REDIRECT_TOL, check_redirect
from vitsinks.models import ATTN_KINDS, KINDS, SinkAttention
from vitsinks.models.kinds import AttentionKind


def reference_rows(attn: SinkAttention, s: torch.Tensor, head: int, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, null share) in float64 from one head's scores s (B, N, N), row by row from the kind's naive formula
    (`AttentionKind.reference`); the null share is 0 for kinds without a null key."""
    kind = KINDS[attn.attn_kind]
    B, n, _ = s.shape
    a, null = torch.zeros(B, n, n, dtype=torch.float64), torch.zeros(B, n, 1, dtype=torch.float64)
    for b in range(B):
        for i in range(n):
            keys = i + 1 if causal else n
            row = kind.reference(attn, s[b, i, :keys].double(), head, n)
            a[b, i, :keys] = row[:keys]
            if kind.null_key:
                null[b, i, 0] = row[-1]
    return a, null


def _redirect64(attn: SinkAttention, s: torch.Tensor, sink: torch.Tensor, causal: bool, head: int = 1) -> torch.Tensor:
    """float64 redirect from one head's scores s (B, [maps,] N, N), row by row from the kind's naive redirect
    (`AttentionKind.reference_redirected`; by default the kind's attention with column sink[b] zeroed and the row's
    mass given back to the other keys in proportion, shared with a null key, the layout's last key). float64 holds
    these weights at leads of a few hundred nats."""
    kind = KINDS[attn.attn_kind]
    B, n = s.shape[0], s.shape[-2]
    keys = n + int(kind.null_key)
    out = torch.zeros(B, n, keys, dtype=torch.float64)
    for b in range(B):
        for i in range(n):
            seen = i + 1 if causal else n
            at = int(sink[b])
            pos = seen if at == n else (at if at < seen else None)  # a null key's share is the row's last
            row = kind.reference_redirected(attn, s[b, ..., i, :seen].double(), head, n, pos)
            out[b, i, :seen] = row[:seen]
            if kind.null_key:
                out[b, i, -1] = row[-1]
    return out


def _strong_sink_head(kind: str, sink: torch.Tensor) -> tuple[SinkAttention, torch.Tensor]:
    """A 2-head attention and inputs (3 images, 6 tokens) whose head 1 scores key sink[b] ~150 above the others (in
    each map of a kind that forms several), every query alike up to a few %: q = c + (a small read of the first
    head's coordinates), k = x. For sigmoid the other scores sit near -140 so that their weights underflow in float32
    too."""
    g = torch.Generator().manual_seed(0)
    attn = SinkAttention(8, num_heads=2, qkv_bias=True, attn=kind)
    u = torch.randn(4, generator=g)
    u /= u.norm()
    offset = -140.0 if kind == "sigmoid" else 0.0
    with torch.no_grad():
        w, b = attn.qkv.weight, attn.qkv.bias
        w.zero_(), b.zero_()
        w[4:8, 0:4] = 0.02 * torch.randn(4, 4, generator=g)  # head 1's queries read head 0's coordinates only
        b[4:8] = u / attn.scale  # scale * q . k = u . k (plus the small part)
        w[8:16] = torch.eye(8)  # k = x (+ the offset below)
        b[12:16] = offset * u
        w[16:24] = torch.randn(8, 8, generator=g)
        for name in attn.kind_parameter_names:  # the kind's own parameters (sink_logit's null logit) away from 0
            getattr(attn, name).fill_(0.5)
        # the score of q = u / scale against k = u in each of the kind's maps: 1 for q . k / sqrt(d)
        unit = attn.kind.scores(attn, (u / attn.scale).double().view(1, 1, 1, 4), u.double().view(1, 1, 1, 4))
    x = torch.randn(3, 6, 8, generator=g)
    x[torch.arange(3), sink, 4:8] += float(150.0 / unit.min()) * u  # the sink's key leads by ~150 nats
    return attn, x


def _scores64(attn: SinkAttention, x: torch.Tensor, head: int) -> torch.Tensor:
    """Head `head`'s scores recomputed in float64 from the module's weights (no qk norm), (B, N, N); a kind with its
    own `scores` (several maps, (B, maps, N, N)) forms them from these q and k (its own tests check them)."""
    qkv = x.double() @ attn.qkv.weight.double().T + attn.qkv.bias.double()
    hd = attn.head_dim
    q = qkv[..., head * hd : (head + 1) * hd]
    k = qkv[..., 8 + head * hd : 8 + (head + 1) * hd]
    if attn.kind.scores is not AttentionKind.scores:
        return attn.kind.scores(attn, q.unsqueeze(1), k.unsqueeze(1))[:, 0]
    return (q @ k.transpose(-2, -1)) * hd**-0.5


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ATTN_KINDS)
def test_redirect_from_the_scores_matches_float64_under_a_150_nat_sink_lead(kind: str, causal: bool) -> None:
    """Under a lead where float32 A holds exactly zero off the sink (the old probability rescaling could only keep
    those rows switched off), `SinkAttention.redirected` agrees with the float64 redirect row by row."""
    sink = torch.tensor([0, 3, 5]) if causal else torch.tensor([1, 3, 5])
    attn, x = _strong_sink_head(kind, sink)
    s64 = _scores64(attn, x, 1)
    truth = _redirect64(attn, s64, sink, causal)
    maps = s64.reshape(3, -1, 6, 6)  # (B, maps, N, N): one map for most kinds
    lead = maps[torch.arange(3), :, :, sink] - maps.masked_fill(
        torch.nn.functional.one_hot(sink, 6).bool().view(3, 1, 1, 6), -math.inf).amax(-1)
    assert lead.min() > 130  # the regime of the issue, by construction (in every map)
    with torch.no_grad():
        ours = attn.redirected(x, 1, sink, causal=causal)
        a32 = attn.internals(x, causal=causal).attn[:, 1]
    sees_sink = a32[torch.arange(3), :, sink] > 0
    off32 = a32.clone()
    off32[torch.arange(3), :, sink] = 0.0
    if kind != "relu":  # relu has no exponential: nothing underflows
        assert (off32.sum(-1)[sees_sink] == 0).all()  # float32 A: every row that sees the sink is off elsewhere
    assert ours.dtype == torch.float32 and ours.shape == (3, 6, 6 + KINDS[kind].null_key)
    mass = truth.abs().sum(-1)  # |A|: a signed kind's weights may be negative
    rows = mass > 1e-30  # rows whose mass float32 can hold (causal sigmoid rows before the sink cannot)
    err = (ours.double() - truth).abs().sum(-1) / mass.clamp_min(1e-300)
    assert (err[rows] < 1e-3).all(), float(err[rows].max())
    assert (ours[~rows].abs().sum(-1) <= 1e-30).all()  # nothing off the sink (relu: no positive score; causal row 0)
    assert rows[sees_sink].float().mean() > 0.7  # most redirected rows do carry mass
    assert (ours[torch.arange(3), :, sink] == 0).all()


@pytest.mark.parametrize("kind", ATTN_KINDS)
def test_the_redirect_check_passes_the_scores_of_a_and_catches_other_scores(kind: str) -> None:
    torch.manual_seed(0)
    attn = SinkAttention(8, num_heads=2, qkv_bias=True, attn=kind)
    x = torch.randn(3, 6, 8, generator=torch.Generator().manual_seed(1))
    sink = torch.tensor([0, 2, 5])
    with torch.no_grad():
        a = attn.internals(x).attn[:, 1]
        err, rows = check_redirect(a, attn.redirected(x, 1, sink), sink, attn)
        if not attn.kind.expected_redirect(attn, a, sink)[1].any():  # A alone predicts no row of the redirect
            assert attn.kind.expected_redirect is not AttentionKind.expected_redirect  # the kind's own declaration
            assert (err, rows) == (0.0, 0)
            return
        assert err < 1e-5 and rows >= 15  # a diffuse head: (almost) every row is checked
        attn.qkv.weight[4:8] *= 1.5  # other queries than those A was computed from
        assert check_redirect(a, attn.redirected(x, 1, sink), sink, attn)[0] > REDIRECT_TOL


def test_redirect_of_non_finite_scores_is_non_finite_not_zero() -> None:
    for kind in ATTN_KINDS:
        attn, x = _strong_sink_head(kind, torch.tensor([1, 3, 5]))
        x[0, 2, 0] = float("nan")
        with torch.no_grad():
            assert torch.isnan(attn.redirected(x, 1, torch.tensor([1, 3, 5]))[0]).any(), kind


def old_rescaled(a: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """The probability rescaling vitsinks used before (float32 rows with nothing left off the sink stay 0)."""
    out = a.clone()
    out[torch.arange(len(a)), :, sink] = 0.0
    total, rest = a.sum(-1, keepdim=True), out.sum(-1, keepdim=True)
    return torch.where(rest > 0, out * (total / rest.clamp_min(1e-30)), out)


def test_redirect_on_a_strong_sink_agrees_with_float64_end_to_end_where_probability_rescaling_does_not() -> None:
    model = cls_sink_vit()
    x = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():  # the regime, measured in float64: every query's [CLS] score leads by > 100 nats
        m64 = copy.deepcopy(model).double()
        z = m64.blocks[0].norm1(m64.embed_tokens(x.double()))
        q, k, _ = m64.blocks[0].attn._qkv(z)
        s = (q[:, 0] @ k[:, 0].transpose(-2, -1)) * m64.blocks[0].attn.scale
    assert (s[..., 0] - s[..., 1:].amax(-1)).min() > 100
    st = InterveneConfig(n_images=6, heads=["0:0"], edits=["redirect_sink_attention"], batch_size=3)
    res = intervene(adapt(model.eval()), x, None, x[:0], st, progress=False)
    assert {r["sink_idx"] for r in res.rows} == {0}
    ours = np.array([r["final_patch_relrms"] for r in res.rows])
    cls = torch.zeros(6, dtype=torch.long)
    truth = final_patch_relrms_with(model, x, 0, 0, cls, torch.float64, rescaled)
    old = final_patch_relrms_with(model, x, 0, 0, cls, torch.float32, old_rescaled)
    assert (np.abs(ours - truth) / truth < 1e-3).all()
    assert (np.abs(old - truth) / truth > 1e-2).all()  # the old edit switched the rows off instead

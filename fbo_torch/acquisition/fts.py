r"""Federated Thompson sampling as a BoTorch acquisition function (FTS, Algorithm 1)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from botorch.acquisition.acquisition import AcquisitionFunction
from botorch.models.model import Model
from botorch.sampling.pathwise import MatheronPath, draw_matheron_paths
from botorch.utils.transforms import t_batch_mode_transform
from torch import Tensor
from torch.nn import Module

from fbo_torch.acquisition.rff_thompson import _check_features, _omega_from
from fbo_torch.features import RandomFourierFeatures
from fbo_torch.protocol.fidelity import (
    LEARNED_WEIGHTS,
    check_agent_weights,
    fidelity_scores,
    learn_peer_choice,
    peer_counts,
    peer_predictions,
)
from fbo_torch.protocol.input_space import resolve_message_space
from fbo_torch.protocol.messages import AgentMessage, stack_omegas
from fbo_torch.protocol.schedules import OWN, AgentDistribution, draw_sources
from fbo_torch.utils.validation import check_int, check_probability

_SOURCE_Q = "`source` is defined for q = 1, this acquisition has q = {q} candidates: use `sources`."


class FederatedThompsonSampling(AcquisitionFunction):
    r"""One FTS iteration's acquisition for a target agent.

    At construction, for each of the ``q`` candidates independently, draws
    ``u ~ U(0, 1)``: if ``u < p_t`` the candidate maximizes a pathwise posterior
    sample of the target's own ``model`` (line 4); otherwise it draws an agent
    ``n ~ P_N`` and maximizes ``φ(x)ᵀω_n`` (line 6): the choice of
    :func:`~fbo_torch.protocol.schedules.draw_sources`, the one the simulator
    makes. ``forward`` returns the sum over the q candidates of their functions,
    so ``optimize_acqf`` maximizes each one independently.

    Args:
        model: The target agent's model, unbatched and single-output: any model
            BoTorch's pathwise sampling supports, e.g. ``SingleTaskGP`` (also with
            a :class:`~fbo_torch.kernels.SharedRFFKernel`) or a one-agent
            :class:`~fbo_torch.models.RFFBayesianLinear`.
        messages: ``N x M`` tensor of received weight vectors, or a sequence of
            :class:`~fbo_torch.protocol.AgentMessage` (fingerprints are checked
            against ``features``). May be empty (``N = 0``) only with ``p_t = 1``,
            e.g. in a loop that has used every message. A tensor carries no
            fingerprint: weights drawn on another feature map (another seed,
            lengthscale or ``M`` of the same size) are *not* detected unless
            ``fingerprint`` says which map they were drawn on; send
            :class:`~fbo_torch.protocol.AgentMessage` between agents
            (:meth:`RFFBayesianLinear.messages <fbo_torch.models.RFFBayesianLinear.messages>`)
            to have every one checked.
        features: The shared :class:`RandomFourierFeatures`.
        p_t: Probability in ``[0, 1]`` of using the own GP sample. With
            ``p_t = 1`` every candidate uses it and nothing is drawn from ``generator``
            for the choice.
        agent_probs: ``P_N`` over the ``N`` messages (uniform by default); must
            be non-negative and sum to 1. Zero entries (stragglers) are never chosen.
        agent_weights: ``"uniform"`` (``agent_probs`` as given) or ``"learned"``:
            ``P_N`` re-weighted by how well each message ranks the target's own
            observations (:mod:`fbo_torch.protocol.fidelity`), restricted to the
            messages ``agent_probs`` allows; or ``"corroborated"`` (the sybil
            defence): learned weights whose near-duplicate count also counts peers
            whose maximizers over ``reference_points`` coincide, times a cross-check
            of each maximizer by the peers outside its group
            (:func:`~fbo_torch.protocol.fidelity.corroborated_counts`;
            ``docs/security.md`` measures what it stops and what it does not).
        peer_trust: Scale the probability of following a message by the trust
            in ``P_N``'s draw: ``p_t' = 1 - (1 - p_t)·g``
            (:func:`~fbo_torch.protocol.fidelity.peer_trust`).
        train_X: The target's ``n x d`` observed inputs (raw, like the candidates), for
            ``"learned"`` weights and ``peer_trust``; by default the model's training inputs
            (a model with an input transform must be given ``train_X``: its stored inputs
            are transformed).
        train_Y: The target's ``n`` (or ``n x 1``) observed values at ``train_X``, for
            ``"learned"`` weights and ``peer_trust``; by default the model's training targets.
        generator: Optional ``torch.Generator``; it drives ``u``, the agent draw
            and (through a derived seed) the GP sample, so construction is
            reproducible.
        q: Number of candidates (independent draws) for parallel evaluations.
        own_acquisition: What the own-GP branch maximizes: any single-point (q = 1)
            BoTorch acquisition of the target's model, e.g.
            ``LogExpectedImprovement(model, best_f)``; ``None`` (default): a pathwise
            Thompson sample of ``model``, as the papers. Only with ``q = 1``.
        input_transform: The input transform ``T`` the senders' models applied
            (e.g. ``Normalize(d, bounds=...)``; ``torch.nn.Identity()`` for raw
            inputs): messages are evaluated as ``φ(T(x))ᵀω_n`` on raw candidates
            ``x``. Messages from :meth:`RFFBayesianLinear.messages
            <fbo_torch.models.RFFBayesianLinear.messages>` carry ``T`` (their
            ``input_bounds``) and need no argument; raw ``ω`` tensors are taken as
            fitted on raw inputs, unless ``model`` has an input transform: then
            ``input_transform`` is required (the rule of
            :func:`~fbo_torch.protocol.input_space.resolve_message_space`).
        reference_points: ``C x d`` raw points (like the candidates) on which ``"corroborated"``
            weights compare the peers' maximizers; required with it: a finite domain's candidates,
            or :func:`fbo_torch.protocol.fidelity.reference_points` of the box (a fixed Sobol set).
        fingerprint: The fingerprint (:attr:`~fbo_torch.features.RandomFourierFeatures.fingerprint`)
            of the map a ``messages`` tensor was drawn on (e.g. sent beside it, or the
            sender's ``rff.fingerprint``); a ``ValueError`` when it is not ``features``'s.

    Attributes:
        source: ``"own"`` or the chosen message index (q = 1).
        sources: List of the q sources.
        agent_probs: The ``N`` probabilities ``P_N`` the messages were drawn with
            (learned ones with ``agent_weights="learned"`` or ``"corroborated"``; ``None`` with ``p_t = 1``).
        fidelity: ``N`` fidelity scores of the messages (``None`` unless learned or trusted).
        p_t_used: The probability of the own GP actually used (``p_t'`` with ``peer_trust``).
        message_space: The map ``T`` applied to candidates before ``φ``.

    Example:
        >>> acqf = FederatedThompsonSampling(gp, messages, rff, p_t=0.5)
        >>> # peers normalized their inputs: their messages say so (or pass input_transform=)
        >>> acqf = FederatedThompsonSampling(gp, peers.messages(), rff, p_t=0.5)
        >>> x, _ = optimize_acqf(acqf, bounds, q=1, num_restarts=10, raw_samples=512)
        >>> acqf.source   # log it; in one-shot mode remove that message afterwards
    """

    omegas: Tensor

    def __init__(
        self,
        model: Model,
        messages: Tensor | Sequence[AgentMessage],
        features: RandomFourierFeatures,
        p_t: float,
        agent_probs: Tensor | None = None,
        generator: torch.Generator | None = None,
        q: int = 1,
        agent_weights: str = "uniform",
        peer_trust: bool = False,
        train_X: Tensor | None = None,
        train_Y: Tensor | None = None,
        own_acquisition: AcquisitionFunction | None = None,
        input_transform: Module | None = None,
        fingerprint: str | None = None,
        reference_points: Tensor | None = None,
    ) -> None:
        features = _check_features(features)
        super().__init__(model=model)
        if model.num_outputs != 1 or len(model.batch_shape) > 0:
            raise ValueError(
                "`model` must be a single-output, unbatched GP of the target agent "
                f"(got num_outputs={model.num_outputs}, batch_shape={tuple(model.batch_shape)})."
            )
        inputs = getattr(model, "train_inputs", None)
        if inputs and inputs[0].shape[-1] != features.dim:
            raise ValueError(
                f"`features` is a {features.dim}-dimensional map but `model` was trained on "
                f"{inputs[0].shape[-1]}-dimensional inputs: messages on that map describe another search space."
            )
        q = check_int("q", q, minimum=1)
        if own_acquisition is not None:
            if not isinstance(own_acquisition, AcquisitionFunction):
                raise ValueError(
                    "`own_acquisition` must be a BoTorch AcquisitionFunction (or None for a Thompson "
                    f"sample), got {type(own_acquisition).__name__}."
                )
            if q != 1:
                raise ValueError(
                    f"`own_acquisition` is supported with q = 1 (one candidate), got q = {q}; "
                    "leave it None for Thompson samples of q candidates."
                )
        p_t = check_probability("p_t", p_t)
        check_agent_weights(agent_weights)
        if agent_weights == "corroborated":
            if not isinstance(reference_points, Tensor) or reference_points.ndim != 2:
                raise ValueError(
                    "agent_weights='corroborated' needs `reference_points`, a C x d tensor (a finite domain's "
                    "candidates, or fbo_torch.protocol.fidelity.reference_points(bounds) for a box)."
                )
            if reference_points.shape[-1] != features.dim or reference_points.shape[0] == 0:
                raise ValueError(
                    f"`reference_points` must be C x {features.dim} with C >= 1, got shape "
                    f"{tuple(reference_points.shape)}."
                )
            if not bool(torch.isfinite(reference_points).all()):
                raise ValueError("`reference_points` holds non-finite values.")
        if not isinstance(peer_trust, bool):
            raise ValueError(f"`peer_trust` must be True or False, got {peer_trust!r}.")
        if isinstance(messages, Tensor):
            omegas = _omega_from(features, messages, name="messages", fingerprint=fingerprint)
            if omegas.ndim != 2:
                raise ValueError(f"`messages` must be an N x M tensor, got shape {tuple(omegas.shape)}.")
        elif isinstance(messages, Sequence) and len(messages) == 0:
            like = features.spectral
            omegas = torch.empty(0, features.num_features, dtype=like.dtype, device=like.device)
        else:
            stacked = stack_omegas(list(messages), fingerprint=features.fingerprint, dim=features.dim)
            omegas = _omega_from(features, stacked, "messages")
        N = omegas.shape[0]
        space = resolve_message_space(messages, input_transform, features.dim, model=model if N else None)
        fidelity, probs_used, p_used = None, None, p_t
        if p_t == 1.0:  # line 4 for every candidate: no draw, and no message is needed
            sources = torch.full((q,), OWN, dtype=torch.long)
        else:
            if N == 0:
                raise ValueError(
                    f"`messages` is empty but p_t = {p_t} < 1 asks for a message with probability {1 - p_t:.3g}; "
                    "pass at least one message, or p_t = 1 (e.g. once every message has been used)."
                )
            if agent_probs is not None:
                if not isinstance(agent_probs, Tensor) or agent_probs.ndim != 1:
                    raise ValueError(f"`agent_probs` must be a tensor of {N} probabilities.")
                agent_probs = agent_probs.expand(q, -1)
            dist = AgentDistribution(N, probs=agent_probs, batch_shape=torch.Size([q]))
            if bool(dist.is_empty.any()):
                raise ValueError(
                    "`agent_probs` gives probability 0 to every agent; use p_t = 1 when no message is usable."
                )
            if agent_weights in LEARNED_WEIGHTS or peer_trust:
                X, y = _target_data(model, train_X, train_Y)
                fidelity = fidelity_scores(peer_predictions(features, omegas, space(X.to(omegas))), y.to(omegas))
                reference = None if reference_points is None else space(reference_points.to(omegas))
                copies = peer_counts(agent_weights, features, omegas, fidelity, reference)
                p_q = learn_peer_choice(dist, fidelity, y.isfinite().sum(), p_t, agent_weights, peer_trust, copies)
                p_used = float(p_q[0]) if isinstance(p_q, Tensor) else p_q  # the q candidates share it
            sources = draw_sources(p_used, dist, generator=generator)
            probs_used = dist.probs[0]

        self.features = features
        self.message_space = space
        self.p_t = p_t
        self.p_t_used = p_used
        self.agent_probs = probs_used
        self.fidelity = fidelity
        self.register_buffer("omegas", omegas)
        self.sources: list[str | int] = ["own" if int(s) == OWN else int(s) for s in sources]
        own = [j for j, s in enumerate(self.sources) if s == "own"]
        self._own_slots = own
        self._agent_slots = [j for j, s in enumerate(self.sources) if s != "own"]
        self.paths: MatheronPath | None = None
        self.own_acquisition = own_acquisition
        if own and own_acquisition is None:
            seed = None
            if generator is not None:
                seed = int(torch.randint(2**62, (1,), generator=generator, device=generator.device).item())
            devices = [omegas.device] if omegas.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices, enabled=seed is not None):
                if seed is not None:
                    torch.manual_seed(seed)
                self.paths = draw_matheron_paths(model, sample_shape=torch.Size([len(own)]))

    @property
    def source(self) -> str | int:
        if len(self.sources) != 1:
            raise AttributeError(_SOURCE_Q.format(q=len(self.sources)))
        return self.sources[0]

    def __getattr__(self, name: str) -> Tensor | Module:
        # nn.Module.__getattr__ would replace the property's AttributeError with a bare
        # "object has no attribute 'source'"; it is only reached when the property raised
        if name == "source":
            raise AttributeError(_SOURCE_Q.format(q=len(self.sources)))
        return super().__getattr__(name)

    @property
    def q(self) -> int:
        return len(self.sources)

    @t_batch_mode_transform()  # type: ignore[arg-type]  # BoTorch's annotation rejects subclasses' methods
    def forward(self, X: Tensor) -> Tensor:
        r"""Sum over candidates of each candidate's sampled function; ``b x q x d`` → ``b``."""
        if X.shape[-2] != self.q:
            raise ValueError(f"This acquisition was drawn for q = {self.q} candidates, got X with q = {X.shape[-2]}.")
        total = torch.zeros(X.shape[:-2], dtype=X.dtype, device=X.device)
        if self._own_slots and self.own_acquisition is not None:  # q = 1
            total = total + self.own_acquisition(X[..., self._own_slots, :])
        elif self._own_slots:
            assert self.paths is not None  # drawn at construction for own slots without own_acquisition
            X_own = X[..., self._own_slots, :].unsqueeze(-2)  # b x q_own x 1 x d
            total = total + self.paths(X_own).squeeze(-1).sum(-1)
        if self._agent_slots:
            idx = torch.tensor([self.sources[j] for j in self._agent_slots], device=X.device)
            omega = self.omegas.to(X)[idx]  # q_agent x M
            phi = self.features(self.message_space(X[..., self._agent_slots, :]))  # b x q_agent x M
            total = total + (phi * omega).sum(-1).sum(-1)
        return total


def _target_data(model: Model, train_X: Tensor | None, train_Y: Tensor | None) -> tuple[Tensor, Tensor]:
    """The target's ``n x d`` inputs and ``n`` observations, given or from ``model``."""
    if train_X is None:
        if getattr(model, "input_transform", None) is not None:
            raise ValueError(
                "`model` has an input transform, so its stored training inputs are transformed: pass "
                "`train_X` (the raw inputs, like the candidates) with agent_weights='learned' "
                "or peer_trust=True."
            )
        inputs = getattr(model, "train_inputs", None)
        if not inputs:
            raise ValueError(
                "agent_weights='learned' and peer_trust=True need the target's observations: "
                "pass `train_X` and `train_Y` (this model stores no training data)."
            )
        train_X = inputs[0]
    if train_Y is None:
        targets = getattr(model, "train_targets", None)
        if targets is None:
            raise ValueError(
                "agent_weights='learned' and peer_trust=True need `train_Y` (this model stores no targets)."
            )
        train_Y = targets  # outcome transforms are increasing: the ranks, hence the scores, are unchanged
    if train_X.ndim != 2:
        raise ValueError(f"`train_X` must be an n x d tensor, got shape {tuple(train_X.shape)}.")
    y = train_Y.reshape(train_Y.shape[0], -1) if train_Y.ndim == 2 else train_Y
    if y.ndim == 2:
        if y.shape[-1] != 1:
            raise ValueError(f"`train_Y` must have one output (n or n x 1), got shape {tuple(train_Y.shape)}.")
        y = y.squeeze(-1)
    if y.shape[0] != train_X.shape[0]:
        raise ValueError(f"`train_X` has {train_X.shape[0]} points but `train_Y` has {y.shape[0]} values.")
    return train_X, y

r"""What agents do in a round, for any number of agents at once.

FTS and DP-FTS-DE split a round between agents and a server. This module is
the agents' half, written once: :class:`Agents` holds ``B`` agents' local
state (observations, RFF weight posterior, GP hyperparameters) and its
methods are the steps of a round —

* :meth:`Agents.message`: draw ``ω_n`` from the RFF posterior (the only thing an agent sends);
* :meth:`Agents.own_proposals`: refit (on schedule) and sample the own GP,
  maximize the sample (the own branch of Thompson sampling), or maximize an
  analytic acquisition of it (``own_acquisition``: LogEI, UCB);
* :meth:`Agents.use_own`: the ``p_t`` coin;
* :meth:`Agents.observe`: add the evaluated point (a failed evaluation is
  recorded and left out of the models).

and the functions a round is made of, for the simulator and a deployed agent
alike: :func:`start_agents` (initial queries), :func:`agent_messages` (what
agents send), :func:`broadcast_points` (where agents that follow a broadcast
query) and :func:`agent_round` (choose, evaluate, observe).

The batched simulator (:mod:`fbo_torch.simulate`) calls them with all ``R·N``
agents of a federation's repetitions; a deployment (:mod:`fbo_torch.flower`)
calls the same methods with ``B = 1`` on each device. Every random number an
agent uses comes from its own key (:mod:`fbo_torch.utils.keyed_random`) folded
with the round and the purpose, so agent ``n``'s round is the same computation
in both places, on CPU or GPU, and a resumed run redraws nothing.

Nothing on the GPU path (:func:`~fbo_torch.utils.dispatch.gpu_path`) reads a device
value on the host: a round on a GPU launches kernels without waiting for them. On a
CPU, where such a read is free, the own proposals are computed only for the agents
whose ``p_t`` coin uses them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fbo_torch.acquisition.batched import (
    BatchedAnalyticAcquisition,
    BatchedLogExpectedImprovement,
    BatchedUpperConfidenceBound,
)
from fbo_torch.acquisition.peer_prior import BatchedPriorGuided
from fbo_torch.acquisition.search import broadcast_queries
from fbo_torch.features import RandomFourierFeatures
from fbo_torch.federation.chunks import CPU_CHUNK, agents_per_chunk, chunk_slices, own_step_bytes, round_budget
from fbo_torch.federation.faults import FaultInjector, evaluate_agents
from fbo_torch.federation.settings import DPFTSDESettings, MethodSettings
from fbo_torch.methods.base import OWN_ACQUISITIONS
from fbo_torch.models.batched_gp import BatchedExactGP, log_lengthscales
from fbo_torch.models.gp_posterior import BatchedGPPosterior
from fbo_torch.models.gp_spec import get_spec
from fbo_torch.models.outcome_warp import log_gap_warps
from fbo_torch.models.rff_blr import RFFBayesianLinear
from fbo_torch.optim.domain import Domain
from fbo_torch.protocol.partition import SubRegionPartition
from fbo_torch.protocol.schedules import OWN, draw_sources
from fbo_torch.sampling.gp_paths import GPThompsonPaths
from fbo_torch.utils import keyed_random as kr
from fbo_torch.utils.dispatch import gpu_path
from fbo_torch.utils.validation import check_tensor


class Agents:
    r"""The local state of ``B`` agents and the steps each takes in a round.

    Args:
        keys: ``B`` int64 keys, one per agent (e.g. ``fold(root_key(seed), agent)``).
        train_X: ``B x n0 x d`` initial inputs.
        train_Y: ``B x n0 x 1`` observations (NaN marks a failed evaluation).
        domain: The :class:`~fbo_torch.optim.domain.Domain` agents search.
        settings: Method settings (``gp_kernel``, ``gp_refit_every``,
            ``gp_sample_features``, ``gp_fit_maxiter``, ``rff_noise_variance``).
        features: The shared RFF map (``None`` for agents that send nothing, e.g. TS).
        capacity: Observations each agent will add (storage is reserved once).
        max_memory: Working-memory budget of the own proposals (bytes, or a size like
            ``"4GiB"``; ``None``: half of what the device has free). Agents whose GP refits and
            sample maximizations would need more run in chunks
            (:mod:`~fbo_torch.federation.chunks`), with the same results.
    """

    def __init__(
        self,
        keys: Tensor,
        train_X: Tensor,
        train_Y: Tensor,
        domain: Any,
        settings: MethodSettings,
        features: RandomFourierFeatures | None = None,
        capacity: int = 0,
        max_memory: int | str | None = None,
    ) -> None:
        check_tensor("keys", keys)
        check_tensor("train_X", train_X)
        B, n0, d = train_X.shape
        if keys.shape != (B,) or keys.dtype != torch.int64:
            raise ValueError(f"`keys` must be {B} int64 keys (one per agent), got {keys.dtype} {tuple(keys.shape)}.")
        if train_Y.shape != (B, n0, 1):
            raise ValueError(f"`train_Y` must have shape {(B, n0, 1)}, got {tuple(train_Y.shape)}.")
        dev, dt = train_X.device, train_X.dtype
        self.keys = keys.to(dev)
        self.domain, self.settings, self.features = domain, settings, features
        self.gp_spec = get_spec(settings.gp_kernel)
        cap = n0 + max(0, int(capacity))
        self._X = torch.zeros(B, cap, d, dtype=dt, device=dev)
        self._Y = torch.full((B, cap), torch.nan, dtype=dt, device=dev)
        self._valid = torch.zeros(B, cap, dtype=torch.bool, device=dev)
        y0 = train_Y.squeeze(-1)
        self._X[:, :n0] = train_X
        self._valid[:, :n0] = torch.isfinite(y0)
        self._Y[:, :n0] = torch.where(self._valid[:, :n0], y0, torch.nan)
        self.n = n0
        self.memory_budget = round_budget(max_memory, dev)
        self.gp_params: Tensor | None = None
        self.gp_updates = 0
        #: ``B`` indices of each agent's output warp at its last GP (``gp_warp="auto"``; 0 is the identity).
        self.warp_choice: Tensor | None = None
        #: Optional per-agent lengthscale prior ``(loc, scale)``, ``B x k`` each (e.g. learned from peers):
        #: each agent's GP is then fitted under the spec's prior and under this one, and keeps the fit
        #: that predicts its held-out observations better (leave-one-out, :meth:`gp`; ``None``: the
        #: spec's prior only).
        self.ls_prior: tuple[Tensor, Tensor] | None = None
        #: ``B``: which prior each agent's last GP kept (0 the spec's, 1 :attr:`ls_prior`), or ``None``.
        self.prior_choice: Tensor | None = None
        self.rff: RFFBayesianLinear | None = None
        if features is not None:
            self.rff = RFFBayesianLinear(
                features,
                train_X,
                torch.where(self._valid[:, :n0], y0, 0.0).unsqueeze(-1),
                settings.rff_noise_variance,
                mask=self._valid[:, :n0].clone(),
            ).reserve(max(0, int(capacity)))

    # ------------------------------------------------------------------ data
    @property
    def num_agents(self) -> int:
        return self.keys.shape[0]

    @property
    def train_X(self) -> Tensor:
        """``B x n x d`` inputs queried so far."""
        return self._X[:, : self.n]

    @property
    def train_Y(self) -> Tensor:
        """``B x n x 1`` observations (NaN where the evaluation failed)."""
        return self._Y[:, : self.n].unsqueeze(-1)

    @property
    def mask(self) -> Tensor:
        """``B x n`` booleans: valid observations."""
        return self._valid[:, : self.n]

    def round_keys(self, round: int, purpose: str) -> Tensor:
        """``B`` keys for ``purpose`` in round ``round``."""
        return kr.fold(kr.fold(self.keys, round), purpose)

    def observe(self, X_new: Tensor, y: Tensor) -> Tensor:
        r"""Add one evaluated point per agent.

        Args:
            X_new: ``B x d`` queried points.
            y: ``B`` observed values; NaN or ``±inf`` marks a failed evaluation, which is
                stored as such and left out of the GP and the RFF posterior.

        Returns:
            ``B`` booleans: which observations were valid.
        """
        ok = torch.isfinite(y)
        n = self.n
        if n >= self._X.shape[1]:  # grow (only when more rounds run than reserved)
            extra = max(8, n)
            self._X = torch.cat([self._X, self._X.new_zeros(self._X.shape[0], extra, self._X.shape[-1])], 1)
            self._Y = torch.cat([self._Y, self._Y.new_full((self._Y.shape[0], extra), torch.nan)], 1)
            self._valid = torch.cat([self._valid, self._valid.new_zeros(self._valid.shape[0], extra)], 1)
        self._X[:, n] = X_new
        self._Y[:, n] = torch.where(ok, y, torch.nan)
        self._valid[:, n] = ok
        self.n = n + 1
        if self.rff is not None:
            self.rff.update(
                X_new.unsqueeze(1), torch.where(ok, y, 0.0).view(-1, 1, 1), mask=ok.unsqueeze(-1), validate=False
            )
        return ok

    # -------------------------------------------------------------- messages
    def message(self, round: int) -> Tensor:
        r"""``B x M`` draws ``ω_n ~ N(ν_n, σ²Σ_n⁻¹)`` of round ``round`` (the agents' messages)."""
        if self.rff is None or self.features is None:  # both or neither (__init__)
            raise RuntimeError("These agents have no shared feature map (`features=None`): they send no messages.")
        M = self.features.num_features
        rff = self.rff if self.settings.message_outputs == "raw" else self.message_model()
        base = kr.normal(self.round_keys(round, "omega"), M + rff._n, dtype=rff.weight_mean.dtype)
        return rff.sample_weights(base_samples=base)

    def message_model(self) -> RFFBayesianLinear:
        r"""The RFF posterior messages are drawn from, on the outputs ``settings.message_outputs``
        names: ``"raw"`` (the observations, the papers' choice), ``"standardized"`` (each agent's
        observations standardized: the prior mean 0 of ``ω`` is then the agent's average value,
        not a value far above every observation of a function whose values are all large and
        negative) or ``"warped"`` (standardized after the agent's GP output warp, see
        :mod:`~fbo_torch.models.outcome_warp`; standardized until its GP has chosen one)."""
        if self.rff is None or self.features is None:  # both or neither (__init__)
            raise RuntimeError("These agents have no shared feature map (`features=None`): they send no messages.")
        mode = self.settings.message_outputs
        y, mask = self.train_Y.squeeze(-1), self.mask
        if mode == "raw":
            return self.rff
        if mode == "warped" and self.warp_choice is not None:
            Z, _ = log_gap_warps(y, mask)
            y = Z.gather(0, self.warp_choice.view(1, -1, 1).expand(1, *y.shape)).squeeze(0)
        count = mask.sum(-1, keepdim=True).clamp_min(1)
        mean = torch.where(mask, y, 0.0).sum(-1, keepdim=True) / count
        var = torch.where(mask, (y - mean) ** 2, 0.0).sum(-1, keepdim=True) / (count - 1).clamp_min(1)
        std = torch.where(var > 0, var.sqrt(), torch.ones_like(var))
        z = torch.where(mask, (y - mean) / std, 0.0)
        return RFFBayesianLinear(
            self.features, self.train_X, z.unsqueeze(-1), self.settings.rff_noise_variance, mask=mask.clone()
        )

    def incumbents(self) -> Tensor:
        r"""``B x d``: each agent's best valid observation's input (its first point while it has none)."""
        y = torch.where(self.mask, self.train_Y.squeeze(-1), -torch.inf)
        return self.train_X[torch.arange(self.num_agents, device=y.device), y.argmax(-1)]

    def log_lengthscales(self) -> Tensor | None:
        r"""``B x k``: the log lengthscales (unit-cube units) of each agent's last fitted GP, at the
        output warp it chose (``k = d`` with ARD, else 1); ``None`` before the first fit.

        Always the fit under the spec's prior, also where the agent kept a fit under
        :attr:`ls_prior`: what an agent shares is its own data's evidence, not a consensus its
        peers' lengthscales pulled it towards (pooling those again would count the peers twice
        and narrow the federation's prior round after round)."""
        if self.gp_params is None:
            return None
        B = self.num_agents
        rows = torch.arange(B, device=self.gp_params.device)
        if self.warp_choice is not None:
            rows = self.warp_choice * B + rows  # the spec's prior: the first K x B candidates
        return log_lengthscales(self.gp_params[rows], self.gp_spec, self._X.shape[-1])

    def current_gp(self) -> BatchedExactGP:
        r"""The agents' GPs at their current hyperparameters (no refit, the refit schedule untouched):
        what their last own proposals were computed on."""
        updates = self.gp_updates
        model = self.gp(refit=self.gp_params is None)
        self.gp_updates = updates
        return model

    # ---------------------------------------------------------------- own GP
    def gp(self, refit: bool | None = None) -> BatchedExactGP:
        r"""The agents' exact GPs on their current data.

        Hyperparameters are fitted on the first call and then every
        ``gp_refit_every`` calls (from the default initialization, or warm-started
        with ``gp_warm_start``); in between the previous ones are kept.

        With ``gp_warp="auto"`` the GPs of every candidate warp of every agent
        (:func:`~fbo_torch.models.outcome_warp.log_gap_warps`, ``K x B``) are fitted as
        one batch and each agent keeps the warp whose evidence for its original
        observations is highest (:attr:`warp_choice`); the returned model is on the
        warped outcomes.
        """
        s = self.settings
        if refit is None:
            refit = self.gp_params is None or (s.gp_refit_every > 0 and self.gp_updates % s.gp_refit_every == 0)
        X, Y, mask = self._gp_data()
        B = X.shape[0]
        K = 1
        log_jac: Tensor | float = 0.0
        if s.gp_warp != "none":
            Z, log_jac = log_gap_warps(Y.squeeze(-1), mask)
            K = Z.shape[0]
            X, Y, mask = X.repeat(K, 1, 1), Z.reshape(K * B, -1, 1), mask.repeat(K, 1)
        # candidate models: every warp (K), under the spec's prior and, with `ls_prior`, under that one too
        prior = None
        P = 1
        if self.ls_prior is not None:
            P = 2
            spec_loc, spec_scale = self.gp_spec.ls_prior(X.shape[-1])
            own_loc, own_scale = self.ls_prior
            prior = (
                torch.cat([torch.full_like(own_loc, spec_loc).repeat(K, 1), own_loc.repeat(K, 1)]),
                torch.cat([torch.full_like(own_scale, spec_scale).repeat(K, 1), own_scale.repeat(K, 1)]),
            )
            X, Y, mask = X.repeat(P, 1, 1), Y.repeat(P, 1, 1), mask.repeat(P, 1)
        params = self.gp_params
        if params is not None and params.shape[0] != K * P * B:  # the candidates changed: fit afresh
            params, refit = None, True
        model = BatchedExactGP(
            X,
            Y,
            self.domain.bounds,
            spec=self.gp_spec,
            mask=mask,
            params=params,
            validate=False,
            ls_prior=prior,
        )
        if refit:
            if params is not None and not s.gp_warm_start:
                model.params = model.initial_params(model.params.shape[0], model.params.dtype, model.params.device)
            restarts = None
            if s.gp_restarts > 0:
                keys = self.keys.repeat(K * P)
                restarts = model.random_params(kr.fold(kr.fold(keys, self.gp_updates), "gp-restarts"), s.gp_restarts)
            model.fit(maxiter=s.gp_fit_maxiter, restarts=restarts)
        self.gp_params = model.params
        self.gp_updates += 1
        if K * P > 1:
            # log p(y) = log p_GP(standardized w(y)) + Σ log w'(y_i) − n log s (the standardization's scale),
            # the GP's term with its hyperparameters' prior at the fit (a MAP approximation of the evidence)
            C = K * P
            n = model.num_valid.view(C, B)
            jac = log_jac.repeat(P, 1) if isinstance(log_jac, Tensor) else log_jac
            evidence = model.mll().view(C, B) * n - n * model.y_std.view(C, B).log() + jac
            evidence = torch.where(torch.isfinite(evidence), evidence, -torch.inf)
            best = evidence.argmax(0)  # B; candidate 0 (identity warp, spec prior) where every one failed
            if P > 1:
                # each prior's warp by evidence, then the prior whose model predicts the agent's held-out
                # observations better (leave-one-out, in the original units): the MAP evidence holds the
                # prior's density at the fit, which a narrower prior raises whether or not it fits better
                warp = evidence.view(P, K, B).argmax(1)  # P x B
                loo = model.loo_log_predictive().view(C, B) - n * model.y_std.view(C, B).log() + jac
                loo = torch.where(torch.isfinite(loo), loo, -torch.inf).view(P, K, B)
                pick = loo.gather(1, warp.unsqueeze(1)).squeeze(1).argmax(0)  # B; the spec's prior on ties
                best = pick * K + warp.gather(0, pick.unsqueeze(0)).squeeze(0)
            rows = best * B + torch.arange(B, device=best.device)
            self.warp_choice = best % K if K > 1 else None
            self.prior_choice = best // K if P > 1 else None
            model = BatchedExactGP(
                X[rows],
                Y[rows],
                self.domain.bounds,
                spec=self.gp_spec,
                mask=mask[rows],
                params=model.params[rows],
                validate=False,
                ls_prior=None if prior is None else (prior[0][rows], prior[1][rows]),
            )
        return model

    def _gp_data(self) -> tuple[Tensor, Tensor, Tensor]:
        """The GP's training data. On CUDA: the whole reserved storage, future slots masked,
        so every round has the same shapes and its phases replay as CUDA graphs; on a CPU
        only the rows in use (less arithmetic). Both give the same GP."""
        if self._X.is_cuda:
            return self._X, self._Y.unsqueeze(-1), self._valid
        return self.train_X, self.train_Y, self.mask

    def own_proposals(
        self,
        round: int,
        which: Tensor | None = None,
        incumbent: str = "observed",
        refit: bool = True,
        acquisition: str | None = None,
    ) -> tuple[Tensor, Tensor]:
        r"""Each agent's maximizer of its own GP's acquisition (``acquisition``, by default
        ``settings.own_acquisition``): ``(B x d, B)`` points and the values reached.

        ``"ts"``: a Thompson sample (Matheron path from the agent's key); ``"logei"``:
        log expected improvement over the agent's best valid observation; ``"ucb"``: the
        upper confidence bound with ``β = ucb_beta``. All agents are maximized in one batch,
        or in chunks that fit the agents' ``memory_budget`` (the same results).

        Args:
            round: The round.
            incumbent: LogEI's ``best_f``: ``"observed"`` (the best valid observation,
                :meth:`best_observed`) or ``"plug-in"`` (:meth:`plug_in_incumbent`).
            which: Optional ``B`` booleans: the agents whose proposal is needed (``None``: all).
                Off the GPU path (:func:`~fbo_torch.utils.dispatch.gpu_path`: a CPU without
                ``FBO_SYNC_FREE=1``) only these are maximized and the other rows are NaN; every
                agent's GP is still built and refitted on schedule (its state does not depend
                on ``which``), and a needed row is the same number as without ``which`` (keyed
                streams). On the GPU path every row is computed (fixed shapes, no host read).
            refit: ``False`` for a second proposal in the same round: the GPs at their current
                hyperparameters (:meth:`current_gp`: no refit, the refit schedule untouched)
                instead of a GP update (:meth:`gp`).
            acquisition: ``"ts"``, ``"logei"`` or ``"ucb"`` instead of ``settings.own_acquisition``
                (``None``: the setting), e.g. a second, exploring proposal in the same round.

        Returns:
            ``(X, values)``: ``B x d`` points and the ``B`` values reached (NaN rows for the agents left out by
            ``which``).
        """
        B = self.num_agents
        if which is not None and (which.shape != (B,) or which.dtype != torch.bool):
            raise ValueError(f"`which` must be {B} booleans (one per agent), got {which.dtype} {tuple(which.shape)}.")
        acquisition = self.settings.own_acquisition if acquisition is None else acquisition
        if acquisition not in OWN_ACQUISITIONS:
            raise ValueError(f"`acquisition` must be 'ts', 'logei' or 'ucb', got {acquisition!r}.")
        needed = None if which is None or gpu_path(self._X.device) else which  # a host tensor: read freely

        def step(part: Agents, rows: slice) -> tuple[Tensor, Tensor]:
            model = part.gp() if refit else part.current_gp()
            keys = part.round_keys(round, "own-maximize")
            fn: GPThompsonPaths | BatchedAnalyticAcquisition
            if acquisition == "ts":
                F = part.settings.gp_sample_features or 1024
                fn = model.draw_paths(part.round_keys(round, "own-sample"), num_features=F)
            else:
                fn = part.own_acquisition(model, incumbent, acquisition)
            need = None if needed is None else needed[rows]
            index = None if need is None else needed_rows(need)
            if need is None or index is None:
                return part.domain.maximize(fn, part.num_agents, keys=keys)
            dt, dev = part._X.dtype, part._X.device
            X = torch.full((part.num_agents, part._X.shape[-1]), torch.nan, dtype=dt, device=dev)
            values = torch.full((part.num_agents,), torch.nan, dtype=dt, device=dev)
            if index.numel() > 0:
                keep = need[index]  # False for a padding row: its result is dropped
                Xs, vs = part.domain.maximize(fn.take(index), index.numel(), keys=keys[index])
                X[index[keep]], values[index[keep]] = Xs[keep], vs[keep]
            return X, values

        X, values = self.in_chunks(step)
        return X, values

    def prior_guided_proposals(
        self, round: int, centers: Tensor, log_weights: Tensor, exponent: float | Tensor, width: float, floor: float
    ) -> tuple[Tensor, Tensor]:
        r"""Each agent's maximizer of its own analytic acquisition plus ``exponent`` times the log
        of its peers' prior over the optimizer (πBO, :mod:`~fbo_torch.acquisition.peer_prior`):
        ``(B x d, B)`` points and values.

        Args:
            round: The round (the maximizer's keys).
            centers: ``B x K x d`` peers' believed optimizers (domain coordinates).
            log_weights: ``B x K`` log ``P_N`` (``-inf``: not a peer).
            exponent: ``β/t`` (a number or ``B`` values).
            width, floor: The bumps' width (unit-cube units) and the prior's floor ``λ``.

        Returns:
            ``(X, values)``: ``B x d`` points and the ``B`` values reached.
        """

        def step(part: Agents, rows: slice) -> tuple[Tensor, Tensor]:
            e = exponent[rows] if isinstance(exponent, Tensor) and exponent.ndim > 0 else exponent
            acq = BatchedPriorGuided(part.own_acquisition(part.gp()), centers[rows], log_weights[rows], e, width, floor)
            return part.domain.maximize(acq, part.num_agents, keys=part.round_keys(round, "own-maximize"))

        X, values = self.in_chunks(step)
        return X, values

    # ---------------------------------------------------------------- chunks
    def chunks(self) -> list[slice]:
        r"""The contiguous groups of agents whose own proposals run together this round: as many
        as their working memory (:func:`~fbo_torch.federation.chunks.own_step_bytes` at the current
        number of observations) lets fit ``memory_budget`` (bytes; ``None``: no limit), and on a
        CPU at most :data:`~fbo_torch.federation.chunks.CPU_CHUNK`."""
        per_agent = own_step_bytes(self.settings, self.domain, self.n, self._X.shape[-1])
        cap = None if gpu_path(self._X.device) else CPU_CHUNK
        return chunk_slices(self.num_agents, agents_per_chunk(self.memory_budget, per_agent, cap))

    def in_chunks(self, step: Callable[[Agents, slice], tuple[Tensor, ...]]) -> tuple[Tensor, ...]:
        r"""``step(part, rows)`` on each of :meth:`chunks` (``part``: these agents' rows ``rows`` as an
        :class:`Agents` viewing this one's storage), the GP state it leaves (hyperparameters, warps,
        refit counter) written back, and the tensors it returns (``part.num_agents`` rows each)
        concatenated in agent order. All agents at once when they fit the budget."""
        groups = self.chunks()
        if len(groups) == 1:
            return step(self, slice(None))
        outs, parts = [], []
        for rows in groups:
            part = self._part(rows)
            outs.append(step(part, rows))
            parts.append(part)
        B, last = self.num_agents, parts[-1]
        if last.gp_params is not None:
            K = last.gp_params.shape[0] // last.num_agents  # warps: rows k * B + b
            params = [q.gp_params.view(K, q.num_agents, -1) for q in parts if q.gp_params is not None]
            self.gp_params = torch.cat(params, 1).reshape(K * B, -1)
        choices = [q.warp_choice for q in parts if q.warp_choice is not None]
        if choices:
            self.warp_choice = torch.cat(choices)
        priors = [q.prior_choice for q in parts if q.prior_choice is not None]
        if priors:
            self.prior_choice = torch.cat(priors)
        self.gp_updates = last.gp_updates
        return tuple(torch.cat(list(column)) for column in zip(*outs, strict=True))

    def _part(self, rows: slice) -> Agents:
        """The agents ``rows`` as an :class:`Agents` viewing this one's storage (its GP state
        sliced; no messages, no further chunking)."""
        part = object.__new__(Agents)
        part.keys = self.keys[rows]
        part.domain, part.settings, part.features, part.gp_spec = self.domain, self.settings, None, self.gp_spec
        part._X, part._Y, part._valid = self._X[rows], self._Y[rows], self._valid[rows]
        part.n, part.gp_updates, part.rff, part.memory_budget = self.n, self.gp_updates, None, None
        part.gp_params = None
        if self.gp_params is not None:
            B = self.num_agents
            K = self.gp_params.shape[0] // B
            part.gp_params = self.gp_params.view(K, B, -1)[:, rows].reshape(-1, self.gp_params.shape[-1])
        part.warp_choice = None if self.warp_choice is None else self.warp_choice[rows]
        part.ls_prior = None if self.ls_prior is None else (self.ls_prior[0][rows], self.ls_prior[1][rows])
        part.prior_choice = None if self.prior_choice is None else self.prior_choice[rows]
        return part

    def own_acquisition(
        self, model: BatchedExactGP, incumbent: str = "observed", acquisition: str | None = None
    ) -> BatchedAnalyticAcquisition:
        r"""The agents' analytic acquisition on ``model`` (their GPs) for ``own_acquisition``
        ``"logei"`` or ``"ucb"``: a ``B x C x d -> B x C`` function (:mod:`fbo_torch.acquisition.batched`);
        ``incumbent`` and ``acquisition`` (``None``: ``settings.own_acquisition``) as in :meth:`own_proposals`."""
        s = self.settings
        name = "own_acquisition" if acquisition is None else "acquisition"  # the argument the value came from
        acquisition = s.own_acquisition if acquisition is None else acquisition
        if acquisition not in ("logei", "ucb"):
            raise ValueError(f"`{name}` {acquisition!r} has no analytic acquisition (expected 'logei' or 'ucb').")
        posterior = model.posterior_moments()
        if acquisition == "ucb":
            return BatchedUpperConfidenceBound(posterior, s.ucb_beta)
        if incumbent not in ("observed", "plug-in"):
            raise ValueError(f"`incumbent` must be 'observed' or 'plug-in', got {incumbent!r}.")
        best = self.best_observed(model) if incumbent == "observed" else self.plug_in_incumbent(model, posterior)
        return BatchedLogExpectedImprovement(posterior, best)

    def plug_in_incumbent(self, model: BatchedExactGP, posterior: BatchedGPPosterior | None = None) -> Tensor:
        r"""``B``: each agent's largest posterior mean at its own valid observations.

        The "plug-in" incumbent (Picheny et al. 2013): with noisy observations the best
        *observed* value is biased upwards, so expected improvement over it undervalues a
        candidate that is only as good as the incumbent. :class:`~fbo_torch.methods.transfer.Transfer`
        scores peers' incumbents against it. It is not the agent's own LogEI ``best_f``: there
        the smaller plug-in value makes LogEI exploit and, measured on the FTS paper's synthetic
        newcomer (``benchmarks/peers/run_ours.py``), stalls the local engine in a local optimum.
        Falls back to :meth:`best_observed` for an agent without valid observations."""
        posterior = posterior if posterior is not None else model.posterior_moments()
        lo, hi = model.bounds
        X = lo + model.X * (hi - lo)  # the training inputs in domain coordinates (padding rows: masked)
        mean = posterior.moments(X)[0]  # B x n
        best = torch.where(model.mask, mean, -torch.inf).amax(-1)
        return torch.where(torch.isfinite(best), best, self.best_observed(model))

    def best_observed(self, model: BatchedExactGP | None = None) -> Tensor:
        r"""``B``: each agent's best valid observation so far (LogEI's ``best_f``). An agent
        without any valid observation gets its GP's standardization mean (``model``'s, else 0),
        where its posterior is the prior: expected improvement is then the same everywhere."""
        if model is not None and self.settings.gp_warp != "none":  # the model's (warped) outcome units
            y = model.y_mean.unsqueeze(-1) + model.y_std.unsqueeze(-1) * model.y
            best = torch.where(model.mask, y, -torch.inf).amax(-1)
            return torch.where(torch.isfinite(best), best, model.y_mean)
        best = torch.where(self._valid, self._Y, -torch.inf).amax(-1)
        fallback = torch.zeros_like(best) if model is None else model.y_mean
        return torch.where(torch.isfinite(best), best, fallback)

    def use_own(self, round: int, p: float) -> Tensor:
        r"""``B`` booleans: with probability ``p`` the agent follows its own GP this round
        (the coin of :func:`~fbo_torch.protocol.schedules.draw_sources`)."""
        return draw_sources(p, None, keys=kr.fold(self.keys, round)) == OWN

    def next_queries(
        self, round: int, p: float, X_broadcast: Tensor | None = None, received: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        r"""Each agent's query of round ``round`` (FTS / DP-FTS-DE Algorithm 1's choice).

        With probability ``p`` (always when ``X_broadcast`` is ``None``: nothing
        was received) the agent's own proposal (:meth:`own_proposals`: the maximizer
        of a Thompson sample of its own GP, or of ``own_acquisition``), otherwise
        ``X_broadcast`` (the maximizer of what it received).

        Args:
            round: The round.
            p: ``p_t``, probability of the own GP.
            X_broadcast: ``B x d`` maximizers of the received functions, or ``None``.
            received: Optional ``B`` booleans: the agents whose federation released
                (the others take their own proposal, as if nothing was received).

        Returns:
            ``(X_next, used_broadcast)``: ``B x d`` queries and ``B`` booleans.
        """
        p_eff = p if X_broadcast is not None else 1.0
        own = draw_sources(p_eff, None, keys=kr.fold(self.keys, round)) == OWN
        if received is not None and X_broadcast is not None:
            own = own | ~received
        if p_eff <= 0 and received is None and X_broadcast is not None:  # p_eff < 1 only with a broadcast
            X, used = X_broadcast, ~own
        else:
            X_own, _ = self.own_proposals(round, which=own)  # NaN where not own (on a CPU): never read
            if X_broadcast is None:
                X, used = X_own, torch.zeros_like(own)
            else:
                X, used = torch.where(own.unsqueeze(-1), X_own, X_broadcast), ~own
        if self.settings.repeated_query == "random":
            X = self._replace_repeats(X, round)
        return X, used

    def _replace_repeats(self, X: Tensor, round: int) -> Tensor:
        """Queries equal (to 1e-9 of the domain's width) to an earlier query of the same agent
        become uniform random points of the domain (the authors' rule)."""
        width = self.domain.bounds[1] - self.domain.bounds[0]
        close = ((self.train_X - X.unsqueeze(1)).abs() <= 1e-9 * width).all(-1) & self.mask  # B x n
        fresh = self.domain.random(X.shape[0], 1, keys=self.round_keys(round, "repeat"))[:, 0]
        return torch.where(close.any(-1, keepdim=True), fresh, X)

    def evaluate(
        self, objective: Any, agent_ids: Tensor, X_next: Tensor, round: int, faults: Any | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        r"""Evaluate each agent's query on its objective (once) and :meth:`observe` it.

        Failures — an exception, a NaN/inf value, or one injected by ``faults``
        (a :class:`~fbo_torch.federation.faults.FaultInjector`) — are recorded
        and left out of the models; nobody stops.

        Returns:
            ``(y, f, ok)``: ``B`` observations (NaN where failed), ``B`` noiseless
            values of the queries (``-inf`` where failed; for the records, never
            seen by the models) and ``B`` booleans (the evaluation succeeded).
        """
        y, f, _ = evaluate_agents(objective, X_next, agent_ids, self.round_keys(round, "evaluate"))
        if faults is not None:
            y = torch.where(faults.failed(self.keys, round), torch.nan, y)
        ok = self.observe(X_next, y)
        return torch.where(ok, y, torch.nan), torch.where(ok & torch.isfinite(f), f, -torch.inf), ok

    # ----------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly (the RFF factors are saved, not refactorized)."""
        state = {
            "keys": self.keys,
            "X": self._X,
            "Y": self._Y,
            "valid": self._valid,
            "n": self.n,
            "gp_params": self.gp_params,
            "gp_updates": self.gp_updates,
            "warp_choice": self.warp_choice,
            "prior_choice": self.prior_choice,
            "ls_prior": self.ls_prior,
        }
        if self.rff is not None:
            state["rff_buffers"] = {k: v for k, v in self.rff.named_buffers(recurse=False)}
            state["rff_n"] = self.rff._n
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        dev = self.keys.device
        if not torch.equal(state["keys"].to(dev), self.keys):
            raise ValueError("The saved agents have other keys (another seed or federation); refusing to load them.")
        self._X, self._Y, self._valid = state["X"].to(dev), state["Y"].to(dev), state["valid"].to(dev)
        self.n = int(state["n"])
        self.gp_params = None if state["gp_params"] is None else state["gp_params"].to(dev)
        self.gp_updates = int(state["gp_updates"])
        choice = state.get("warp_choice")
        self.warp_choice = None if choice is None else choice.to(dev)
        prior_choice, ls_prior = state.get("prior_choice"), state.get("ls_prior")
        self.prior_choice = None if prior_choice is None else prior_choice.to(dev)
        self.ls_prior = None if ls_prior is None else (ls_prior[0].to(dev), ls_prior[1].to(dev))
        if self.rff is not None:
            for name, buf in state["rff_buffers"].items():
                setattr(self.rff, name, buf.to(dev))
            self.rff._n = int(state["rff_n"])


def start_agents(
    objective: Any,
    settings: DPFTSDESettings,
    domain: Domain,
    keys: Tensor,
    agent_ids: Tensor,
    features: RandomFourierFeatures | None,
    partition: SubRegionPartition | None,
    max_memory: int | str | None = None,
) -> tuple[Agents, Tensor]:
    r"""``B`` agents after their initial queries, and their best initial (noiseless) values ``B``.

    The simulator calls it with every agent of every repetition, a deployed
    agent (:mod:`fbo_torch.flower`) with its own key and index: both get the
    same points (each from the agent's key) and the same models.

    Args:
        objective: The :class:`~fbo_torch.objectives.base.Objective` the agents evaluate.
        settings: The method's :class:`~fbo_torch.federation.settings.DPFTSDESettings`.
        domain: The :class:`~fbo_torch.optim.domain.Domain` agents search.
        keys: ``B`` agent keys (:func:`~fbo_torch.protocol.keys.federation_agent_keys`).
        agent_ids: ``B`` agent indices in the objective (agent ``n`` explores region ``n mod P``).
        features: The shared map (``None`` for TS).
        partition: The server's sub-regions (distributed initialization when ``P > 1``), or ``None``.
        max_memory: The agents' working-memory budget (:class:`Agents`).

    Returns:
        ``(agents, best)``: the :class:`Agents` and their ``B`` best initial noiseless values.
    """
    spread = (
        settings.method.federated()
        and settings.distributed_init
        and partition is not None
        and partition.num_regions > 1
    )
    X0 = initial_points(domain, keys, settings.num_init, partition if spread else None, agent_ids)
    y0, F0 = observe_initial(objective, X0, agent_ids, keys)
    agents = Agents(
        keys, X0, y0.unsqueeze(-1), domain, settings, features, capacity=settings.num_iterations, max_memory=max_memory
    )
    return agents, F0.max(-1).values


def agent_messages(agents: Agents, round: int, faults: FaultInjector | None = None) -> Tensor:
    r"""``B x M``: what the agents send for the release of round ``round`` — their ``ω``
    draws, with hostile agents' replaced by their attack when ``faults`` injects some."""
    omegas = agents.message(round)
    return omegas if faults is None else faults.corrupt(omegas, agents.keys, round)


def agent_round(
    agents: Agents,
    objective: Any,
    agent_ids: Tensor,
    round: int,
    p: float,
    X_broadcast: Tensor | None,
    faults: FaultInjector | None,
    received: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""The agents' half of round ``round`` after the broadcast: choose, evaluate, observe.

    ``received`` (optional ``B`` booleans) marks the agents whose federation released
    (:meth:`Agents.next_queries`).

    Returns:
        ``(X_next, used_broadcast, ok, f)``: ``B x d`` queries, ``B`` booleans
        (the query came from the broadcast), ``B`` booleans (the evaluation
        succeeded) and ``B`` noiseless values of the queries (``-inf`` where
        the evaluation failed; for the records, never seen by the models).
    """
    X_next, used = agents.next_queries(round, p, X_broadcast, received)
    _, f, ok = agents.evaluate(objective, agent_ids, X_next, round, faults)
    return X_next, used, ok, f


def broadcast_points(
    settings: DPFTSDESettings,
    features: RandomFourierFeatures,
    broadcast: Tensor,
    region_bounds: Tensor,
    domain: Domain,
    round: int,
    federation_keys: Tensor,
    agent_keys: Tensor,
    run_of: Tensor,
) -> Tensor:
    r"""``B x d``: each agent's maximizer of its federation's broadcast ``φ(x)ᵀω^(i[x])``.

    Args:
        settings: The method's settings (``broadcast_maximization``).
        features: The shared map.
        broadcast: ``R x P x M`` releases of ``R`` federations.
        region_bounds: ``P x 2 x d`` sub-regions the releases refer to.
        domain: The :class:`~fbo_torch.optim.domain.Domain` agents search.
        round: The round (the maximizers' keys).
        federation_keys: ``R`` keys of the federations.
        agent_keys: ``B`` keys of the agents.
        run_of: ``B`` indices: the federation of each agent.

    Returns:
        ``B x d`` points, one per agent.

    With ``broadcast_maximization="shared"`` one maximization per federation
    (its key) serves all its agents; with ``"per_agent"`` each agent maximizes
    with its own key. A deployed agent passes ``R = B = 1``.
    """
    if settings.broadcast_maximization == "shared":
        return broadcast_queries(features, broadcast, region_bounds, domain, round, federation_keys)[run_of]
    return broadcast_queries(features, broadcast[run_of], region_bounds, domain, round, agent_keys)


def initial_points(
    domain: Domain,
    keys: Tensor,
    num: int,
    partition: SubRegionPartition | None = None,
    agents: Tensor | None = None,
) -> Tensor:
    r"""``B x num x d`` initial points of each agent, from its key.

    With a ``partition`` (distributed exploration), agent ``n`` draws inside
    region ``n mod P``; on a finite domain, uniformly among that region's candidates.
    """
    init_keys = kr.fold(keys, "initial-points")
    if partition is None:
        return domain.random(keys.shape[0], num, keys=init_keys)
    if agents is None:
        raise ValueError("`agents` (each agent's index) is required with a `partition`.")
    regions = agents % partition.num_regions  # the papers' assignment: agent n explores region n mod P
    if domain.candidates is None:
        rb = partition.region_bounds()[regions]  # B x 2 x d
        u = kr.uniform(init_keys, num * domain.dim, dtype=domain.bounds.dtype).view(-1, num, domain.dim)
        return rb[:, 0:1] + u * (rb[:, 1:2] - rb[:, 0:1])
    cand_region = partition.region_of(domain.candidates)  # C
    member = cand_region.unsqueeze(0) == regions.unsqueeze(-1)  # B x C
    count = member.sum(-1)
    if not bool((count > 0).all()):
        raise ValueError("Some sub-region contains no candidate point; use fewer regions.")
    order = torch.argsort((~member).to(torch.int8), dim=-1, stable=True)  # members first
    pick = (kr.uniform(init_keys, num) * count.unsqueeze(-1)).long().clamp_max(count.unsqueeze(-1) - 1)
    return domain.candidates[order.gather(1, pick)]


def observe_initial(objective: Any, X0: Tensor, agents: Tensor, keys: Tensor) -> tuple[Tensor, Tensor]:
    r"""Observations ``B x n0`` of the initial points and their noiseless values (``-inf`` where failed),
    from one evaluation of each point."""
    y, f, _ = evaluate_agents(objective, X0, agents, kr.fold(keys, "evaluate-init"))
    return y, torch.where(torch.isfinite(y) & torch.isfinite(f), f, -torch.inf)


def needed_rows(needed: Tensor) -> Tensor | None:
    r"""The rows of a chunk to maximize when only ``needed`` (``B`` booleans, on the host) are
    used: ``None`` for all of them (every row is needed, or ``B = 1``: the chunk is computed
    as without a selection), else their indices (empty when none is needed). A single needed
    row of a larger chunk comes with another row of the chunk (whose result is dropped): a
    batch of one problem takes torch's matrix-vector kernel, which rounds differently from
    the batched one the whole chunk takes (:mod:`~fbo_torch.federation.chunks`)."""
    B = needed.numel()
    index = needed.nonzero().view(-1)
    if index.numel() == B or (B == 1 and index.numel() == 1):
        return None
    if index.numel() == 1:
        pad = 1 if int(index[0]) == 0 else 0
        index = torch.stack([index[0], index.new_tensor(pad)]).sort().values
    return index

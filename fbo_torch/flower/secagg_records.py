r"""SecAgg+'s stage messages as Flower records (one ``"fbo.secagg"`` ``ConfigRecord`` each way), and the
names of the records a node keeps in its state for them.

Requests (server to node, message types ``"train.share_keys"``, ``"train.masked_vector"``,
``"train.consistency"``, ``"train.unmask"``) and replies, built by :func:`secagg_request` and
:func:`secagg_reply` and type-checked field by field by :func:`parse_secagg` (a malformed message
raises ``ValueError`` naming the field). The rest of the deployment's messages are in
:mod:`~fbo_torch.flower.records`.

Kept apart from :mod:`~fbo_torch.flower.records` because a node answers each stage in a new
process (Flower starts a ClientApp process per message): this module, like
:mod:`~fbo_torch.flower.secagg`, imports only ``flwr`` and NumPy, so a stage's process does not
import torch, BoTorch or Opacus (:mod:`~fbo_torch.flower.client_app`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ConfigRecord, ConfigRecordValues, RecordDict

#: The record of a SecAgg+ stage's message, both ways (also the round reply's public keys).
SECAGG = "fbo.secagg"
#: Node-state records: the agent's own secret (with the last round it answered), and its side of the running
#: SecAgg+ round.
AGENT_SECRET, SECAGG_STATE = "fbo.agent-secret", "fbo.secagg-state"
#: The key of :data:`AGENT_SECRET` that holds the last round the node answered.
ANSWERED = "answered-round"


def secagg_request(round: int, **payload: ConfigRecordValues) -> RecordDict:
    """A SecAgg+ stage's message to one node: ``round`` and the stage's fields."""
    return RecordDict({SECAGG: ConfigRecord({"round": int(round), **payload})})


def secagg_reply(**payload: ConfigRecordValues) -> RecordDict:
    """A node's reply to a SecAgg+ stage."""
    return RecordDict({SECAGG: ConfigRecord(dict(payload))})


_SECAGG_FIELDS: dict[str, dict[str, tuple[type, type | None]]] = {
    # stage: {field: (type, element type or None)}
    "share_keys": {
        "round": (int, None),
        "node-ids": (list, int),
        "agent-ids": (list, int),
        "pk1": (list, bytes),
        "pk2": (list, bytes),
        "signatures": (list, bytes),
        "threshold": (int, None),
    },
    "masked_vector": {"round": (int, None), "sources": (list, int), "ciphertexts": (list, bytes)},
    "consistency": {"round": (int, None), "survivors": (list, int)},
    "unmask": {
        "round": (int, None),
        "signers": (list, int),
        "signer-agents": (list, int),
        "signatures": (list, bytes),
    },
    "share_keys-reply": {"destinations": (list, int), "ciphertexts": (list, bytes), "commitment": (bytes, None)},
    "masked_vector-reply": {"masked": (bytes, None)},
    "consistency-reply": {"signature": (bytes, None)},
    "unmask-reply": {"node-ids": (list, int), "shares": (list, bytes)},
}


def parse_secagg(kind: str, content: RecordDict) -> dict[str, Any]:
    """The fields of a SecAgg+ message of ``kind`` (a stage, or ``"<stage>-reply"``), type-checked;
    anything else raises ``ValueError`` naming what is wrong."""
    try:
        r = content.config_records[SECAGG]
        out = {k: r[k] for k in _SECAGG_FIELDS[kind]}
    except Exception as err:
        raise ValueError(f"malformed {kind} message ({type(err).__name__}: {err}).") from None
    for key, (kind_, element) in _SECAGG_FIELDS[kind].items():
        v = out[key]
        if (
            isinstance(v, bool)
            or not isinstance(v, kind_)
            or (
                element is not None  # then `kind_` is list
                and not (isinstance(v, list) and all(isinstance(e, element) and not isinstance(e, bool) for e in v))
            )
        ):
            raise ValueError(
                f"{kind}: `{key}` is not a {kind_.__name__}{f' of {element.__name__}' if element else ''}."
            )
    return out


def masked_from_bytes(data: bytes, dim: int) -> np.ndarray:
    """A masked vector sent as ``d`` little-endian int64 (``ValueError`` if the length is wrong)."""
    if len(data) != 8 * dim:
        raise ValueError(f"a masked vector of {len(data)} bytes, expected {8 * dim}.")
    return np.frombuffer(data, dtype="<i8").astype(np.int64)


__all__ = [
    "AGENT_SECRET",
    "ANSWERED",
    "SECAGG",
    "SECAGG_STATE",
    "masked_from_bytes",
    "parse_secagg",
    "secagg_reply",
    "secagg_request",
]

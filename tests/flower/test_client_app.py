"""The ClientApp's SecAgg+ stages run in a process that imports no torch, BoTorch, GPyTorch or Opacus.

Flower starts a ClientApp process per message, so these imports are paid four times a secure round
on every device. The stage below is a real one: three nodes' keys, node 0's ``share_keys`` answered
through the app's handler, its reply parsed as the server parses it.
"""

import json
import subprocess
import sys

HEAVY = ("torch", "botorch", "gpytorch", "opacus", "scipy", "sklearn")

STAGE = f"""
import json, sys
import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fbo_torch.flower import client_app
from fbo_torch.flower.secagg import SecAggClient
from fbo_torch.flower.secagg_records import SECAGG_STATE, parse_secagg, secagg_request

TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = 1, 1, 1  # what Flower's runtime sets
modulus = 2**20
clients = [SecAggClient.setup(100 + n, 1, modulus, np.arange(4) + n) for n in range(3)]
ctx = Context(run_id=1, node_id=100, state=RecordDict(), node_config={{"partition-id": 0}}, run_config={{}})
ctx.state[SECAGG_STATE] = ConfigRecord(clients[0].to_state())
request = secagg_request(
    1,
    **{{
        "node-ids": [c.node_id for c in clients],
        "agent-ids": [0, 1, 2],
        "pk1": [c.pk1 for c in clients],
        "pk2": [c.pk2 for c in clients],
        "signatures": [b"", b"", b""],
        "threshold": 2,
    }},
)
msg = Message(request, dst_node_id=100, message_type="train.share_keys", group_id="1")
reply = client_app.share_keys(msg, ctx)
fields = parse_secagg("share_keys-reply", reply.content)
print(json.dumps({{
    "destinations": sorted(fields["destinations"]),
    "heavy": [m for m in {HEAVY!r} if m in sys.modules],
}}))
"""


def test_a_secagg_stage_runs_without_torch_or_opacus():
    out = subprocess.run([sys.executable, "-c", STAGE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["destinations"] == [101, 102]  # shares for the two neighbours
    assert result["heavy"] == []


def test_importing_the_app_imports_no_model_library():
    code = f"import sys, fbo_torch.flower.client_app; print([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"

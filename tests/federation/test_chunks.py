import pytest
import torch

from fbo_torch.federation.chunks import CPU_CHUNK, agents_per_chunk, chunk_slices, own_step_bytes, round_budget
from fbo_torch.federation.settings import DPFTSDESettings
from fbo_torch.optim.domain import Domain
from fbo_torch.simulate.dp_fts_de import DPFTSDERunner
from fbo_torch.utils.resources import memory_budget, parse_bytes

f64 = torch.float64


@pytest.mark.parametrize("num,size", [(1, 1), (2, 1), (3, 2), (7, 2), (10, 3), (100, 7), (5, None), (5, 50)])
def test_chunks_cover_every_row_once_in_order_and_never_alone(num, size):
    slices = chunk_slices(num, size)
    rows = [i for s in slices for i in range(s.start, s.stop)]
    assert rows == list(range(num))
    lengths = [s.stop - s.start for s in slices]
    assert max(lengths) - min(lengths) <= 1
    if num > 1:
        assert min(lengths) >= 2  # a batch of one takes torch's matrix-vector kernel, which rounds differently
    if size is not None and size >= 2:
        assert max(lengths) <= max(size, 3)


def test_the_budget_sets_the_chunk_size():
    s = DPFTSDESettings()
    dom = Domain(torch.tensor([[0.0] * 3, [1.0] * 3], dtype=f64))
    per = own_step_bytes(s, dom, n=30, dim=3)
    assert per > 0
    assert own_step_bytes(s, dom, n=60, dim=3) > per  # more observations, more memory
    assert agents_per_chunk(None, per) is None
    assert agents_per_chunk(100 * per, per) == 100
    assert agents_per_chunk(1, per) == 2
    assert agents_per_chunk(None, per, cap=CPU_CHUNK) == CPU_CHUNK  # a CPU's cache-sized chunks
    assert agents_per_chunk(10**6 * per, per, cap=CPU_CHUNK) == CPU_CHUNK
    assert agents_per_chunk(100 * per, per, cap=CPU_CHUNK) == 100
    assert round_budget("2GiB", "cpu") == 2 * 2**30
    assert round_budget(12345, "cpu") == 12345


@pytest.mark.parametrize("bad", ["lots", "-1G", 0, True, [1], "1e30T"])
def test_a_bad_budget_names_the_argument(bad):
    with pytest.raises(ValueError, match="max_memory"):
        parse_bytes("`max_memory`", bad)
    with pytest.raises(ValueError, match="max_memory"):
        round_budget(bad, "cpu")


def test_chunked_rounds_equal_the_unchunked_round_bit_for_bit(small_dp_federation):
    # two repetitions of seven agents (B = 14) in chunks of 2-3 agents against all 14 at once: every
    # query, value, message-driven step and ε is the same number
    obj, s, dom = small_dp_federation

    def run(max_memory):
        r = DPFTSDERunner(obj, s, num_inits=2, domain=dom, seed=5, accountant="rdp", max_memory=max_memory)
        sizes = [len(range(14)[c]) for c in r.agents.chunks()]
        res = r.run()
        return r, res, sizes

    whole, a, sizes_a = run("64GiB")
    chunked, b, sizes_b = run(1)
    assert sizes_a == [14] and max(sizes_b) <= 3 and len(sizes_b) >= 5
    assert torch.equal(whole.X, chunked.X) and torch.equal(whole.Y.nan_to_num(), chunked.Y.nan_to_num())
    assert torch.equal(a.loss, b.loss) and torch.equal(a.used_server, b.used_server)
    assert a.epsilon == b.epsilon
    assert torch.equal(whole.agents.gp_params, chunked.agents.gp_params)
    assert whole.agents.gp_updates == chunked.agents.gp_updates


@pytest.mark.parametrize("warp,acq", [("auto", "logei"), ("none", "ucb")])
def test_chunked_own_proposals_keep_every_gp_state(warp, acq):
    from fbo_torch.federation.agents import Agents
    from fbo_torch.protocol.keys import federation_agent_keys
    from fbo_torch.utils import keyed_random as kr

    s = DPFTSDESettings(gp_warp=warp, own_acquisition=acq, gp_kernel="fbo", num_features=20)
    dom = Domain(torch.tensor([[0.0] * 2, [1.0] * 2], dtype=f64), raw_samples=32, num_restarts=2, maxiter=5)
    N = 9
    keys = federation_agent_keys(0, torch.zeros(N, dtype=torch.long), torch.arange(N))
    X0 = dom.random(N, 6, keys=kr.fold(keys, "init"))
    Y0 = torch.sin(6 * X0).sum(-1, keepdim=True)
    whole = Agents(keys, X0, Y0, dom, s, max_memory="64GiB")
    parts = Agents(keys, X0, Y0, dom, s, max_memory=1)
    assert len(parts.chunks()) == 4
    for t in (1, 2):
        Xa, va = whole.own_proposals(t)
        Xb, vb = parts.own_proposals(t)
        assert torch.equal(Xa, Xb) and torch.equal(va, vb)
        for agents in (whole, parts):
            agents.observe(Xa, torch.sin(6 * Xa).sum(-1))
    assert torch.equal(whole.gp_params, parts.gp_params)
    if warp == "auto":
        assert torch.equal(whole.warp_choice, parts.warp_choice)


@pytest.mark.parametrize("value", ["lots", "-1G", 0, True, "1.5 G", "4GiB", 4096])
def test_the_round_budget_reads_max_memory_as_the_experiment_key_does(value):
    """One reading of ``max_memory`` (``memory_budget``): the same spellings and the same message everywhere."""
    from fbo_torch.experiments.config import RunOptions

    def outcome(read):
        try:
            return read(value)
        except ValueError as err:
            return str(err)

    said = outcome(memory_budget)
    assert outcome(lambda v: round_budget(v, "cpu")) == said
    assert outcome(lambda v: RunOptions(max_memory=v).max_memory) == said

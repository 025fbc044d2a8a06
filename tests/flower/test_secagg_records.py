"""SecAgg+ stage messages: built, parsed field by field, and refused with the field named when malformed."""

import numpy as np
import pytest
from flwr.app import ConfigRecord, RecordDict

from fbo_torch.flower.secagg_records import SECAGG, masked_from_bytes, parse_secagg, secagg_reply, secagg_request


def test_a_request_and_a_reply_parse_back_to_their_fields():
    request = secagg_request(4, sources=[1, 2], ciphertexts=[b"a", b"b"])
    assert parse_secagg("masked_vector", request) == {"round": 4, "sources": [1, 2], "ciphertexts": [b"a", b"b"]}
    reply = secagg_reply(signature=b"sig")
    assert parse_secagg("consistency-reply", reply) == {"signature": b"sig"}


@pytest.mark.parametrize(
    "fields, says",
    [
        ({"round": 1, "survivors": [1, True]}, "`survivors` is not a list of int"),  # a bool is no node id
        ({"round": True, "survivors": [1]}, "`round` is not a int"),
        ({"round": 1, "survivors": [1.5]}, "`survivors` is not a list of int"),
        ({"round": 1}, "malformed consistency message"),  # a field missing
    ],
)
def test_a_malformed_stage_message_is_refused_naming_the_field(fields, says):
    with pytest.raises(ValueError, match=says):
        parse_secagg("consistency", RecordDict({SECAGG: ConfigRecord(fields)}))
    with pytest.raises(ValueError, match="malformed consistency message"):
        parse_secagg("consistency", RecordDict())  # no SecAgg+ record at all


def test_a_masked_vector_is_little_endian_int64_of_the_stated_length():
    v = np.array([-1, 0, 2**40], dtype=np.int64)
    assert np.array_equal(masked_from_bytes(v.astype("<i8").tobytes(), 3), v)
    with pytest.raises(ValueError, match="a masked vector of 16 bytes, expected 24"):
        masked_from_bytes(v[:2].astype("<i8").tobytes(), 3)

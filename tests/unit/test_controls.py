from __future__ import annotations

import json

import pytest
from tritonclient.grpc import service_pb2

from tiermesh.core.controls import NO_CONTROLS, PARAMETERS, Controls
from tiermesh.core.jobs import Job, JobResult
from tiermesh.core.wire import decode_job, encode_job, result_from_proto, result_to_proto
from tiermesh.gateway import converters, rest_codec


def test_only_what_differs_from_the_defaults_travels_and_comes_back_as_it_was() -> None:
    assert NO_CONTROLS.to_wire() == {}
    assert Controls.from_wire({}) is NO_CONTROLS
    controls = Controls(sticky_key="user-1", whole_text=True, batch_job="j1", batch_index=0)
    wire = controls.to_wire()
    assert wire == {"sticky_key": "user-1", "whole_text": "1", "batch_job": "j1"}
    assert Controls.from_wire(wire) == controls
    # A name a newer version sends and this one does not know is left out.
    assert Controls.from_wire({**wire, "later_field": "x"}) == controls


def test_a_value_not_of_its_fields_type_leaves_the_field_at_its_default() -> None:
    # From a mesh version beside this one (mid-upgrade): the request is served all the same.
    got = Controls.from_wire({"whole_text": "true", "batch_index": "two", "batch_job": "j"})
    assert got == Controls(batch_job="j")


def test_controls_ride_on_the_job_and_come_back_on_its_result() -> None:
    controls = Controls(rollout_arm="canary", shadow_of="r0", batch_index=7, batch_job="j")
    job = Job("r1", "mlp", (), "gw", controls=controls, annotations={"truncated": "false"})
    back = decode_job(encode_job(job))
    assert back.controls == controls and back.annotations == {"truncated": "false"}
    assert decode_job(encode_job(Job("r2", "mlp", (), "gw"))).controls is NO_CONTROLS
    result = JobResult.for_job(back)
    assert result_from_proto(result_to_proto(result)).controls == controls


def test_the_public_fields_are_read_from_request_parameters_with_their_types() -> None:
    assert "sticky_key" in PARAMETERS and "batch_job" not in PARAMETERS
    assert Controls.from_parameters({}) is NO_CONTROLS
    assert Controls.from_parameters({"sticky_key": "u", "other": 1}).sticky_key == "u"
    with pytest.raises(ValueError, match="parameter 'sticky_key' must be a string, got an int"):
        Controls.from_parameters({"sticky_key": 3})


def test_both_doors_read_the_same_parameters_and_refuse_the_same_types() -> None:
    msg = service_pb2.ModelInferRequest(model_name="mlp")
    msg.parameters["sticky_key"].string_param = "user-42"
    assert converters.infer_request(msg).controls == Controls(sticky_key="user-42")
    doc = {"inputs": [], "parameters": {"sticky_key": "user-42"}}
    rest, _ = rest_codec.parse_infer(json.dumps(doc).encode(), None, "mlp", "")
    assert rest.controls == Controls(sticky_key="user-42")
    msg.parameters["sticky_key"].bool_param = True
    with pytest.raises(Exception, match="parameter 'sticky_key' must be a string, got a bool"):
        converters.infer_request(msg)

"""accel.topology reads the segment variables accel-agent sets."""

from accel.topology import Segment, segment


def test_no_segment_outside_accel():
    assert segment({}) is None


def test_segment_and_its_ranks():
    s = segment({
        "ACCEL_TOPOLOGY": "dc/rack-9",
        "ACCEL_SEGMENT": "1",
        "ACCEL_SEGMENT_FIRST_NODE": "2",
        "ACCEL_SEGMENT_NODES": "3",
    })
    assert s == Segment(path="dc/rack-9", index=1, first_node=2, nodes=3)
    assert list(s.ranks(local_world_size=2)) == [4, 5, 6, 7, 8, 9]


def test_inconsistent_variables_are_named():
    try:
        segment({"ACCEL_SEGMENT": "0", "ACCEL_SEGMENT_NODES": "x"})
    except ValueError as e:
        assert "segment" in str(e)
    else:
        raise AssertionError("accepted a node count of 'x'")

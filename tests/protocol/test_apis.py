import pytest

from replicad.protocol.apis import (
    ApiKey,
    UnsupportedBrokerError,
    VersionRange,
    negotiate,
)


def test_picks_highest_common_version_per_api():
    broker = {
        int(ApiKey.FETCH): VersionRange(0, 13),
        int(ApiKey.METADATA): VersionRange(0, 20),
        int(ApiKey.LIST_OFFSETS): VersionRange(1, 5),
        int(ApiKey.API_VERSIONS): VersionRange(0, 4),
    }
    chosen = negotiate(broker)
    assert chosen.require(ApiKey.FETCH) == 13
    assert chosen.require(ApiKey.METADATA) == 12  # our max
    assert chosen.require(ApiKey.LIST_OFFSETS) == 5
    assert chosen.require(ApiKey.API_VERSIONS) == 3
    # optional API the broker lacks is simply absent
    assert chosen.get(ApiKey.OFFSET_FOR_LEADER_EPOCH) is None


def test_missing_required_api_is_named():
    with pytest.raises(UnsupportedBrokerError, match="FETCH"):
        negotiate({int(ApiKey.METADATA): VersionRange(0, 12)})


def test_disjoint_ranges_name_both_sides():
    broker = {
        int(ApiKey.FETCH): VersionRange(0, 3),
        int(ApiKey.METADATA): VersionRange(0, 12),
        int(ApiKey.LIST_OFFSETS): VersionRange(0, 7),
    }
    with pytest.raises(UnsupportedBrokerError, match=r"broker v0\.\.v3, replicad v4\.\.v17"):
        negotiate(broker)

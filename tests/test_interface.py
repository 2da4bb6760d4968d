"""Both implementations of the front end's interfaces (`runtime/interface.py`) have every member with the
declared parameters: `Runtime` and a `Client` of it in this process, and a `RemoteClient` attached to a
real endpoint (here in the same process, over its Unix socket)."""

import inspect

import pytest

from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.endpoint import Endpoint
from pathways_mlir.runtime.interface import ClusterRuntime, ProgramClient, TopologySource
from pathways_mlir.runtime.remote_client import RemoteClient


def declared_methods(protocol) -> dict:
    """The protocol's methods (its properties and attributes are checked on instances)."""
    return {name: member for name, member in vars(protocol).items()
            if inspect.isfunction(member) and not name.startswith("_")}


def check_implements(instance, protocol) -> None:
    assert isinstance(instance, protocol), f"{type(instance).__name__} lacks a member of {protocol.__name__}"
    for name, declared in declared_methods(protocol).items():
        wanted = list(inspect.signature(declared).parameters.values())[1:]        # without self
        have = inspect.signature(getattr(instance, name)).parameters
        try:     # the declared call binds: positional parameters by position, optional ones by name
            inspect.signature(getattr(instance, name)).bind(
                *[None for p in wanted if p.default is inspect.Parameter.empty],
                **{p.name: p.default for p in wanted if p.default is not inspect.Parameter.empty})
        except TypeError as error:
            pytest.fail(f"{type(instance).__name__}.{name}{inspect.signature(getattr(instance, name))} does not "
                        f"take {protocol.__name__}.{name}'s parameters: {error}")
        assert set(have) >= {p.name for p in wanted if p.default is not inspect.Parameter.empty}


def test_the_embedded_runtime_and_its_client_implement_the_interfaces(runtime):
    check_implements(runtime, ClusterRuntime)
    check_implements(runtime.resources, TopologySource)
    with Client(runtime) as client:
        check_implements(client, ProgramClient)
        assert client.runtime is runtime


def test_a_remote_client_is_both_the_runtime_and_the_client(runtime):
    endpoint = Endpoint(runtime)
    try:
        with RemoteClient(endpoint.socket_path, key_path=endpoint.key_path, timeout=60) as remote:
            check_implements(remote, ClusterRuntime)
            check_implements(remote.resources, TopologySource)
            check_implements(remote, ProgramClient)
            assert remote.runtime is remote
            version, topology = remote.resources.snapshot()
            assert (version, topology.to_json()) == (runtime.resources.version, runtime.resources.topology.to_json())
            assert remote.object_count() == 0
    finally:
        endpoint.close()


def test_an_object_lacking_a_member_is_not_a_client():
    class Half:
        runtime = None

        def run(self, plan, args, dispatch="parallel", timeout=None):
            return []

    assert not isinstance(Half(), ProgramClient)

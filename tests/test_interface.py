"""Both implementations of the front end's interfaces (`runtime/interface.py`) have every member with the
declared parameters: `Runtime` and a `Client` of it in this process, and a `RemoteClient` attached to a
real endpoint (here in the same process, over its Unix socket)."""

from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.endpoint import Endpoint
from pathways_mlir.runtime.interface import ClusterRuntime, ProgramClient, TopologySource
from pathways_mlir.runtime.remote_client import RemoteClient
from protocols import check_implements


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

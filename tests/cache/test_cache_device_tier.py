"""Device tier: CUDA tensors, side-stream copies to and from page-locked host buffers."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")



@pytest.fixture
def gpu_mlc(tmp_path, clock):
    if not torch.cuda.is_available():
        pytest.skip("device tier needs a CUDA device (torch.cuda.is_available() is False)")
    from sdcp_fast.cache import MLC
    from sdcp_fast.cache.tiers.device import DeviceTier
    from sdcp_fast.cache.tiers.disk import DiskTier
    from sdcp_fast.cache.tiers.host import HostTier

    mlc = MLC([DeviceTier(8192), HostTier(8192), DiskTier(1 << 20, str(tmp_path))], clock=clock)
    yield mlc
    mlc.close()


@pytest.mark.gpu
def test_device_tensor_put_lands_on_device_and_reads_back(gpu_mlc):
    rows = torch.rand(4, 100, device="cuda")  # 1600 bytes
    gpu_mlc.put("mlc://" + "0" * 32 + "/s/q_rows/1", rows)
    assert gpu_mlc.head("mlc://" + "0" * 32 + "/s/q_rows/1").tier == "device"
    back = gpu_mlc.get_tensor("mlc://" + "0" * 32 + "/s/q_rows/1", device="cuda")
    assert back.device.type == "cuda" and torch.equal(back, rows)
    host = gpu_mlc.get("mlc://" + "0" * 32 + "/s/q_rows/1")
    assert bytes(host) == rows.cpu().numpy().tobytes()


@pytest.mark.gpu
def test_host_buffers_are_pinned_with_cuda(gpu_mlc):
    host = gpu_mlc.tiers[1]
    assert host.allocator == "torch-pinned"
    gpu_mlc.put("mlc://" + "0" * 32 + "/s/draft_kv/1", b"x" * 100)
    assert gpu_mlc.tiers[1].tensor(gpu_mlc._index["mlc://" + "0" * 32 + "/s/draft_kv/1"].handle).is_pinned()


@pytest.mark.gpu
def test_device_pressure_demotes_to_pinned_host_and_promotes_back(gpu_mlc):
    names = [f"mlc://{'0' * 32}/s/draft_kv/{n}" for n in range(3)]
    tensors = [torch.full((1024,), n, dtype=torch.float32, device="cuda") for n in range(3)]  # 4 KiB each
    for name, t in zip(names, tensors, strict=True):
        gpu_mlc.put(name, t)
    assert gpu_mlc.head(names[0]).tier == "host"
    back = gpu_mlc.get_tensor(names[0], device="cuda")
    assert gpu_mlc.head(names[0]).tier == "device" and torch.equal(back, tensors[0])


class CpuStandInDevice:
    """The device tier's contract with CPU tensors, so the MLC's device paths run without a GPU."""

    host_readable = False

    def __init__(self, capacity: int) -> None:
        self.name = "device"
        self.capacity = capacity
        self.writes: list[str] = []

    def write(self, key, data):
        self.writes.append(type(data).__name__)
        if isinstance(data, torch.Tensor):
            return data.detach().contiguous().reshape(-1).view(torch.uint8).clone()
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def tensor(self, handle):
        return handle

    def empty(self, size):
        return torch.empty(size, dtype=torch.uint8)

    def read(self, handle):
        return memoryview(handle.numpy().tobytes())

    def read_range(self, handle, start, stop):
        return self.read(handle[start:stop])

    def drop(self, handle):
        pass

    def close(self):
        pass


def test_store_device_paths_with_a_stand_in(tmp_path, clock):
    from sdcp_fast.cache import MLC
    from sdcp_fast.cache.tiers.host import HostTier

    dev = CpuStandInDevice(4096)
    mlc = MLC([dev, HostTier(1 << 16)], clock=clock)
    try:
        name = "mlc://" + "0" * 32 + "/s/q_rows/1"
        mlc.put(name, b"\x01" * 64)
        assert mlc.head(name).tier == "host", "host data is written to the fastest host-readable tier"
        rows = mlc.get_tensor(name, device="cuda")
        assert mlc.head(name).tier == "device" and dev.writes == ["Tensor"], "promotion hands over a tensor"
        assert rows.numel() == 64
        assert bytes(mlc.get(name)) == b"\x01" * 64
        assert mlc.head(name).tier == "device", "a host read copies out; it never moves an object down"
    finally:
        mlc.close()

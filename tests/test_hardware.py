import pytest

from jfa_prof import hardware
from jfa_prof.errors import BadInputError


def test_hopper_dense_bf16_peak_is_the_datasheet_989_tflops():
    h100 = hardware.SPECS["h100-sxm"]
    assert h100.peak_tflops("bf16") == pytest.approx(989.4, abs=0.1)
    assert h100.peak_tflops("fp16") == h100.peak_tflops("bf16")
    assert h100.peak_tflops("fp8") == pytest.approx(1978.9, abs=0.1)
    assert h100.peak_tflops("tf32") == pytest.approx(494.7, abs=0.1)


def test_h200_has_h100_compute_and_more_bandwidth():
    h100, h200 = hardware.SPECS["h100-sxm"], hardware.SPECS["h200-sxm"]
    assert h200.peak_tflops() == h100.peak_tflops()
    assert h200.sm_count == 132
    assert h200.hbm_bandwidth_tb_s > h100.hbm_bandwidth_tb_s
    assert h200.compute_capability == (9, 0)
    assert h200.sm_arch == "sm_90"
    # As the driver reports them (torch's L2_cache_size): 50 MiB on H100 SXM, 60 MiB on H200.
    assert (h100.l2_bytes, h200.l2_bytes) == (50 * 2**20, 60 * 2**20)


@pytest.mark.parametrize("name, key", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 SXM5 80GB", "h100-sxm"),
    ("NVIDIA H200", "h200-sxm"),
    ("h200-sxm", "h200-sxm"),
    ("H200", "h200-sxm"),
    ("NVIDIA B200", "b200"),
])
def test_lookup_by_device_name(name, key):
    assert hardware.lookup(name).key == key


@pytest.mark.parametrize("name", ["NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL",
                                  "NVIDIA A100-SXM4-80GB", ""])
def test_parts_missing_from_the_table_are_not_guessed(name):
    assert hardware.lookup(name) is None


def test_lookup_by_capability():
    assert hardware.lookup(capability=(9, 0)).arch == "hopper"
    assert hardware.lookup(capability=(10, 0)).key == "b200"
    assert hardware.lookup(capability=(8, 0)) is None


def test_name_wins_over_capability_and_unknown_names_fall_back_to_it():
    assert hardware.lookup("NVIDIA H200", (9, 0)).key == "h200-sxm"
    pcie = hardware.lookup("NVIDIA H100 PCIe", (9, 0))
    assert pcie is not None and pcie.arch == "hopper"


def test_get_rejects_unknown_gpus_with_exit_code_2():
    with pytest.raises(BadInputError) as info:
        hardware.get("RTX 9090")
    assert info.value.exit_code == 2
    assert "h200-sxm" in str(info.value)


def test_peak_tflops_helper_and_overrides():
    assert hardware.peak_tflops("NVIDIA H200") == hardware.SPECS["h200-sxm"].peak_tflops()
    h200 = hardware.SPECS["h200-sxm"]
    assert hardware.peak_tflops(h200, "torch.bfloat16") == h200.peak_tflops()
    half_clock = h200.peak_tflops(clock_ghz=h200.boost_clock_ghz / 2)
    assert half_clock == pytest.approx(h200.peak_tflops() / 2)
    assert h200.peak_tflops(sm_count=66) == pytest.approx(h200.peak_tflops() / 2)


def test_unknown_dtype_is_bad_input():
    with pytest.raises(BadInputError):
        hardware.SPECS["h100-sxm"].peak_tflops("int4")


def test_ridge_point_moves_left_with_more_bandwidth():
    h100, h200 = hardware.SPECS["h100-sxm"], hardware.SPECS["h200-sxm"]
    assert h200.ridge_flop_per_byte() < h100.ridge_flop_per_byte()
    assert h100.ridge_flop_per_byte() == pytest.approx(989.4e12 / 3.35e12, rel=1e-3)


def test_table_is_read_only():
    with pytest.raises(TypeError):
        hardware.SPECS["x"] = hardware.SPECS["h100-sxm"]
    with pytest.raises(Exception):
        hardware.SPECS["h100-sxm"].sm_count = 1


@pytest.mark.gpu
def test_detect_matches_the_device(cuda_device):
    import torch

    spec = hardware.detect()
    assert spec is not None
    assert spec.sm_count == torch.cuda.get_device_properties(cuda_device).multi_processor_count

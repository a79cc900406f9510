"""The rank's memory censuses on real tensors and real transformers models (CPU), and the rest of
torch_compat (the rendezvous records' names)."""

import threading

import torch

from orchestrator.plan.activations import activation_bytes
from orchestrator.spec import build_spec
from orchestrator.workload.memory_census import ActivationCensus, AllocatorPeak, held_growth, static_bytes
from orchestrator.workload.model import build_model


def test_activation_census_ignores_parameters_even_as_views_of_a_flat_buffer():
    # ZeRO 1-2 make every parameter a view into one flat buffer, and autograd saves
    # aten::t(weight), a view created inside the forward: its storage is that buffer.
    flat = torch.zeros(1_000_000)
    layer = torch.nn.Linear(64, 64, bias=False)
    layer.weight.data = flat[:4096].view(64, 64)
    x = torch.randn(8, 64, requires_grad=True)
    with ActivationCensus() as census:
        y = torch.relu(layer(x))  # saves x (made before), t(weight) (a view) and relu's output
    assert census.bytes == y.numel() * y.element_size()


def test_activation_census_of_a_real_model_is_the_plans_figure():
    spec = build_spec(
        [
            "hardware=cpu",
            "model.n_layers=2",
            "model.hidden=64",
            "model.heads=2",
            "model.kv_heads=2",
            "model.ffn_hidden=256",
            "model.vocab=512",
            "batch.micro_batch_size=2",
        ]
    )
    model = build_model(spec.cfg.model, device="cpu").to(torch.bfloat16)
    tokens = torch.randint(0, 512, (2, spec.cfg.model.seq_len))
    with ActivationCensus() as census:
        loss = model(input_ids=tokens, labels=tokens).loss
    predicted = activation_bytes(spec.cfg.model, 2, "none", "bf16")
    assert abs(predicted / census.bytes - 1) < 0.02
    loss.backward()  # what was counted is what backward needed


def test_static_census_counts_each_storage_once():
    before = static_bytes()
    base = torch.zeros(250_000)  # 1 MB
    views = [base[:10], base.view(500, 500), base[1:]]
    grown = static_bytes() - before
    assert grown == base.untyped_storage().nbytes() and len(views) == 3


def test_static_census_of_one_device_type_leaves_the_others_out():
    base = torch.zeros(250_000)  # 1 MB on the host
    assert static_bytes("cpu") == static_bytes() >= base.untyped_storage().nbytes()
    assert static_bytes("cuda") == 0  # on a GPU rank, host tensors (offloaded states) are not its static memory


MIB = 2**20


def test_allocator_peak_counts_a_block_freed_on_another_thread_once():
    # A gloo worker can drop the last reference to a collective's buffer: c10 reports no
    # free on an unprofiled thread, so its running total would keep the block forever and
    # count the next allocation on top of it (twice the true peak here).
    with AllocatorPeak() as peak:
        held = [torch.ones(MIB)]  # 4 MiB
        worker = threading.Thread(target=held.clear)
        worker.start()
        worker.join()
        again = torch.ones(MIB)
        del again
    assert peak.growth == 4 * MIB


def test_allocator_peak_keeps_a_block_still_alive_at_the_end():
    with AllocatorPeak() as peak:
        kept = torch.ones(MIB)
        transient = torch.ones(MIB // 2)
        del transient
    assert peak.growth == 6 * MIB
    assert kept.numel() == MIB


def test_held_growth_replays_frees_and_addresses_handed_out_again():
    # (address, bytes): a second allocation at a held address means the first was freed unseen.
    assert held_growth([(1, 100), (2, 50), (1, -100), (3, 10)]) == (150, 1)
    assert held_growth([(1, 100), (1, 100), (2, 20)]) == (120, 2)
    assert held_growth([(9, -40), (1, 30)]) == (0, None)  # a block from before the start was freed


def test_rendezvous_records_name_the_method_as_torch_does():
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from orchestrator.workload import torch_compat

    torchs = dynamic_rendezvous.get_method_name

    def record(name_of):  # as DynamicRendezvousHandler._record calls it
        return name_of()

    def next_rendezvous(name_of):
        return record(name_of)

    assert next_rendezvous(torchs) == next_rendezvous(torch_compat._method_name) == "next_rendezvous"
    assert torchs(10_000) == torch_compat._method_name(10_000) == "no_method_name"
    try:
        torch_compat.cheap_rendezvous_records()
        assert next_rendezvous(dynamic_rendezvous.get_method_name) == "next_rendezvous"
    finally:
        dynamic_rendezvous.get_method_name = torchs

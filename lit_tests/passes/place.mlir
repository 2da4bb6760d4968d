// RUN: pw-opt %s --split-input-file --pw-place | FileCheck %s
// RUN: pw-opt %s --split-input-file --pw-place=strategy=spread | FileCheck %s
// RUN: pw-opt %s --split-input-file --pw-place=strategy=pack | FileCheck %s --check-prefix=PACK

// pw-place maps every slice to devices of one island, writing compact device
// ranges; each case carries its topology as the module's pw.topology. These
// modules have no programs, so every placement costs the same and
// strategy=auto (the default) places as spread.

// Spread: slices go to the least loaded island and devices.
// CHECK-LABEL: module attributes {pw.topology
// CHECK: pw.placement = {devices = array<i64: 0, 2>, island = "island0"}, shape = array<i64: 2>, sym_name = "a"
// CHECK: pw.placement = {devices = array<i64: 0, 4>, island = "island1"}, shape = array<i64: 4>, sym_name = "b"
// CHECK: pw.placement = {devices = array<i64: 2, 4>, island = "island0"}, shape = array<i64: 2>, sym_name = "c"
// Pack: fill island0 while it has idle devices.
// PACK-LABEL: module attributes {pw.topology
// PACK: pw.placement = {devices = array<i64: 0, 2>, island = "island0"}, {{.*}}sym_name = "a"
// PACK: pw.placement = {devices = array<i64: 0, 4>, island = "island1"}, {{.*}}sym_name = "b"
// PACK: pw.placement = {devices = array<i64: 2, 4>, island = "island0"}, {{.*}}sym_name = "c"
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 4>, axes = ["x"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "c", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
}

// -----

// More virtual devices than physical ones: slices share the least loaded devices.
// CHECK-LABEL: module attributes {pw.topology
// CHECK: pw.placement = {devices = array<i64: 0, 4>, island = "island0"}, {{.*}}sym_name = "a"
// CHECK: pw.placement = {devices = array<i64: 0, 4>, island = "island1"}, {{.*}}sym_name = "b"
// CHECK: pw.placement = {devices = array<i64: 0, 4>, island = "island0"}, {{.*}}sym_name = "c"
// CHECK: pw.placement = {devices = array<i64: 0, 2>, island = "island1"}, {{.*}}sym_name = "d"
// Pack shares the first island's devices once no island has idle ones.
// PACK-LABEL: module attributes {pw.topology
// PACK: pw.placement = {devices = array<i64: 0, 4>, island = "island0"}, {{.*}}sym_name = "a"
// PACK: pw.placement = {devices = array<i64: 0, 4>, island = "island1"}, {{.*}}sym_name = "b"
// PACK: pw.placement = {devices = array<i64: 0, 4>, island = "island0"}, {{.*}}sym_name = "c"
// PACK: pw.placement = {devices = array<i64: 0, 2>, island = "island1"}, {{.*}}sym_name = "d"
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 4>, axes = ["x"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2, 2>, axes = ["x", "y"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "c", shape = array<i64: 4>, axes = ["x"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "d", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
}

// -----

// Constraints pick the island (kind, memory, name); unavailable devices are
// skipped, which splits a placement into two ranges.
// CHECK-LABEL: module attributes {pw.topology
// CHECK: pw.placement = {devices = array<i64: 0, 2, 3, 5>, island = "tpus"}, {{.*}}sym_name = "t"
// CHECK: pw.placement = {devices = array<i64: 5, 7>, island = "tpus"}, {{.*}}sym_name = "m"
// CHECK: pw.placement = {devices = array<i64: 0, 2>, island = "cpus"}, {{.*}}sym_name = "p"
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "cpus", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "tpus", device_kind = "tpu", hosts = 2, devices_per_host = 4, device_memory_bytes = 4096, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}, unavailable = array<i64: 2>}]}} {
"pw.virtual_slice"() {sym_name = "t", shape = array<i64: 4>, axes = ["x"], constraints = {device_kind = "tpu"}} : () -> ()
"pw.virtual_slice"() {sym_name = "m", shape = array<i64: 2>, axes = ["x"], constraints = {min_memory_bytes = 2048}} : () -> ()
"pw.virtual_slice"() {sym_name = "p", shape = array<i64: 2>, axes = ["x"], constraints = {island = "cpus", same_island = true}} : () -> ()
}

// -----

// 65,536 devices: the placement is still one range.
// CHECK-LABEL: module attributes {pw.topology
// CHECK: pw.placement = {devices = array<i64: 0, 65536>, island = "big"}, {{.*}}sym_name = "huge"
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "big", device_kind = "tpu", hosts = 16384, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "huge", shape = array<i64: 256, 256>, axes = ["x", "y"], constraints = {}} : () -> ()
}

// -----

// 10^12 devices with a few down: placing costs O(slices) per island, not
// O(devices), and a window around the unavailable devices is still a few ranges.
// CHECK-LABEL: module attributes {pw.topology
// CHECK: pw.placement = {devices = array<i64: 0, 1, 2, 5>, island = "vast"}, {{.*}}sym_name = "a"
// CHECK: pw.placement = {devices = array<i64: 5, 7>, island = "vast"}, {{.*}}sym_name = "b"
// CHECK: pw.placement = {devices = array<i64: 7, 1048583>, island = "vast"}, {{.*}}sym_name = "c"
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "vast", device_kind = "tpu", hosts = 250000000000, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}, unavailable = array<i64: 1>}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 4>, axes = ["x"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "c", shape = array<i64: 1024, 1024>, axes = ["x", "y"], constraints = {}} : () -> ()
}

// -----

// Two slices of 2 on 2x4 tell the strategies apart: spread uses both islands,
// pack fills island0 first. (No label: the PACK prefix has none in the cases above.)
// CHECK: pw.placement = {devices = array<i64: 0, 2>, island = "island0"}, {{.*}}sym_name = "a"
// CHECK-NEXT: pw.placement = {devices = array<i64: 0, 2>, island = "island1"}, {{.*}}sym_name = "b"
// PACK: pw.placement = {devices = array<i64: 0, 2>, island = "island0"}, {{.*}}sym_name = "a"
// PACK-NEXT: pw.placement = {devices = array<i64: 2, 4>, island = "island0"}, {{.*}}sym_name = "b"
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
}

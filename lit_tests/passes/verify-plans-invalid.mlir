// RUN: pw-opt %s --split-input-file --verify-diagnostics --pw-verify-plans

// Each case is a plan the runtime must not be given: one change to a valid
// two-island plan (island0 launches and sends, island1 receives), reported
// at the op at fault.

// Buffers read by a step are declared.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
// expected-error@below {{plan of @main: step 0 (launch) names buffer 7, which is not declared}}
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 7>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// Buffer ids are unique.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
// expected-error@below {{declares buffer 1 of @main a second time}}
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// Step ids are unique in the module.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
// expected-error@below {{step 1 reuses the id of another step}}
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// A zero-size buffer is replicated (JAX lays out a sharded one wrongly).
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
// expected-error@below {{buffer 1 has shape [0], no elements, but is sharded: a zero-size buffer is replicated}}
  "pw.buffer"() {id = 1, type = tensor<0xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// Element types have a known size.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
// expected-error@below {{plan of @main: buffer 1: unknown element type '!pw.opaque'}}
  "pw.buffer"() {id = 1, type = tensor<8x!pw.opaque>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// Buffers are bounded.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
// expected-error@below {{plan of @main: buffer 1: shape [1099511627776, 1024] is negative or larger than 1099511627776 elements}}
  "pw.buffer"() {id = 1, type = tensor<1099511627776x1024xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// bytes_per_device is what shape, element type and sharding make.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
// expected-error@below {{plan of @main: buffer 1: bytes_per_device is -1099511627776, but its shape, type and sharding give 16}}
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = -1099511627776} : () -> ()
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// A buffer lives on a slice of its plan's island.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
// expected-error@below {{buffer 2 lives on @a in island0, but is declared in the plan of island1}}
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// Devices are within the island.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
// expected-error@below {{step 0 runs on devices [0, 9], which are not ranges [begin, end) within the 4 devices of island0}}
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 0, 9>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// A launch runs on its slice's devices.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
// expected-error@below {{step 0 runs on devices [1, 3], but @a is placed on [0, 2]}}
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 1, 3>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// Plans are for islands of the topology.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
// expected-error@below {{is a plan of @main for island 'island7', which the topology does not have (islands: island0, island1)}}
module @main_island7 attributes {pw.island_plan = {island = "island7", program = @main}} {
}
}

// -----

// A launch's sizes are its outputs'.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
// expected-error@below {{step 0 has output_bytes [32], but its outputs have [16] bytes per device}}
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 32>, subgraph = 0, label = "f#0"} : () -> ()
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// Every buffer read has a writer or is a program input.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
// expected-error@below {{plan of @main: step 0 (launch) reads buffer 0, which nothing writes}}
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// A reader waits for the writer.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
// expected-error@below {{step 1 reads buffer 1 but does not wait for step 0, which writes it}}
  "pw.send"() {step = 1, after = array<i64>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// Every recv has its send.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
// expected-error@below {{plan of @main: step 2 (recv) of buffer 2 has no matching send of buffer 1 from island0 in its 'after'}}
  "pw.recv"() {step = 2, after = array<i64>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// A recv waits for its send.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
// expected-error@below {{plan of @main: step 2 (recv) of buffer 2 has no matching send of buffer 1 from island0 in its 'after'}}
  "pw.recv"() {step = 2, after = array<i64>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// An island lists a step after the steps of the island it waits for.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
// expected-error@below {{plan of @main: on island0, step 0 (launch) is ordered before step 1, which it depends on}}
  "pw.launch"() {step = 0, after = array<i64: 1>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// Island orders and 'after' have no cycle across islands.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.launch"() {step = 0, after = array<i64: 2>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
// expected-error@below {{plan of @main: steps wait for each other (0 -> 1 -> 2 -> 0): the island orders and the dependencies deadlock}}
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// 'after' names steps of the program.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
// expected-error@below {{plan of @main: step 1 comes after step 9, which does not exist}}
  "pw.send"() {step = 1, after = array<i64: 0, 9>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// The host plan's results are declared.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
// expected-error@below {{plan of @main: output buffer 3 is not declared}}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 3>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// The plans are read only from IR that passes pw-verify: a slice whose mesh does not match its axes is
// reported at the slice, not as "not a placed slice" at every buffer on it.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
// expected-error@below {{slice @a has 1 mesh dimensions but 2 axis names}}
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x", "y"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// A launch's buffers have the types of its executable's entry: the runtime found an argument of another type only
// when it ran the plan, and an extra argument of a fused executable not at all.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
// expected-error@below {{step 0 launches @f on buffers of type (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>, but its entry has type (tensor<8xf32>) -> tensor<8xf32>}}
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 0, 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

// -----

// Of the same element types.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func private @main(tensor<8xf32>) -> tensor<8xi32>
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.buffer"() {id = 0, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.buffer"() {id = 1, type = tensor<8xf32>, home = {slice = @a, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
// expected-error@below {{step 0 launches @f on buffers of type (tensor<8xf32>) -> tensor<8xf32>, but its entry has type (tensor<8xf32>) -> tensor<8xi32>}}
  "pw.launch"() {step = 0, after = array<i64>, executable = @f, slice = @a, devices = array<i64: 0, 2>, inputs = array<i64: 0>, outputs = array<i64: 1>, output_bytes = array<i64: 16>, subgraph = 0, label = "f#0"} : () -> ()
  "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer_buffer = 2, peer = "island1", bytes = 16, link = "dcn", devices = array<i64: 0, 2>, subgraph = 0} : () -> ()
}
module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}} {
  "pw.buffer"() {id = 2, type = tensor<8xf32>, home = {slice = @b, sharding = [["x"]]}, bytes_per_device = 16} : () -> ()
  "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer_buffer = 1, peer = "island0", bytes = 16, link = "dcn", devices = array<i64: 2, 4>, subgraph = 0} : () -> ()
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 2>, subgraphs = [{id = 0, static = true}]}} {
}
}

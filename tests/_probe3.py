import collections
from test_runtime import stage_a, X
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.runtime import Runtime
from pathways_mlir.runtime import policies

log = []
oa, orr = policies.Share.admitted, policies.Share.retired
def adm(self, run, waiting, ds):
    oa(self, run, waiting, ds); log.append(("a", run, run.charged, dict(self.virtual)))
def ret(self, run, s):
    orr(self, run, s); log.append(("r", run, s, dict(self.virtual)))
policies.Share.admitted, policies.Share.retired = adm, ret


def test_probe(device_map, plan_builder):
    for rep in range(12):
        log.clear()
        p = plan_builder(device_map.topology)
        v = p.slice("v", (4,), ("x",), "island0", (0, 4))
        out = p.launch(stage_a, [p.input((8, 16), v, [("x",), ()])], v, [("x",), ()])
        plan = p.build([out])
        rt = Runtime(device_map, policy="share", window=1)
        light, heavy = Client(rt, weight=1), Client(rt, weight=3)
        rt.scheduler.hold()
        runs = []
        for _ in range(40):
            runs.append(light.start(plan, [X]))
            runs.append(heavy.start(plan, [X]))
        rt.scheduler.release()
        for r in runs:
            rt.wait(r, timeout=120)
        rt.usage()
        timed = [r.device_seconds for r in runs if r.device_seconds is not None]
        mean = sum(timed) / len(timed)
        delivered = collections.Counter(c for _, c in list(rt.scheduler.delivered)[:40])
        device = {c.id: sum(mean if r.device_seconds is None else r.device_seconds
                            for r in runs[c is heavy::2][:delivered[c.id]]) for c in (light, heavy)}
        ratio = device[heavy.id] / device[light.id]
        adms = [e for e in log if e[0] == "a"]
        print("ratio %.2f" % ratio, "V40", {k: round(x * 1e3, 1) for k, x in adms[39][3].items()}, "dev", {k: round(x*1e3, 1) for k, x in device.items()},
              "untimed", sum(r.device_seconds is None for r in runs), "mean %.2f" % (mean * 1e3),
              "big", sorted((round((r.device_seconds or 0) * 1e3, 1), "L" if r.client_id == light.id else "H") for r in runs)[-3:])
        rt.close()

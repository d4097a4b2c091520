"""An OTLP profiles receiver built from the official .proto files, not from energy-bpf's code.

It compiles the pinned opentelemetry-proto files (proto/otlp) with grpcio-tools into a
temporary directory, then either
  decode FILE         prints a JSON summary of one binary ExportProfilesServiceRequest, or
  serve PORT DIR      runs an OTLP/gRPC ProfilesService on 127.0.0.1:PORT and, for every
                      Export call, writes the request to DIR/N.pb and its summary to
                      DIR/N.json (N = 1, 2, ...), plus DIR/headers-N.json with the metadata;
                      `--stall` accepts connections but never answers.
"""
import json
import os
import sys
import tempfile
import threading
import time
from concurrent import futures

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.join(HERE, "..", "..", "proto", "otlp")
FILES = [
    "opentelemetry/proto/common/v1/common.proto",
    "opentelemetry/proto/resource/v1/resource.proto",
    "opentelemetry/proto/profiles/v1development/profiles.proto",
    "opentelemetry/proto/collector/profiles/v1development/profiles_service.proto",
]


def compile_protos():
    from grpc_tools import protoc
    import grpc_tools

    out = tempfile.mkdtemp(prefix="otlp-py-")
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = ["protoc", f"-I{PROTO}", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}"]
    if protoc.main(args + FILES) != 0:
        raise SystemExit("protoc failed on the pinned OTLP files")
    sys.path.insert(0, out)
    from opentelemetry.proto.collector.profiles.v1development import (
        profiles_service_pb2,
        profiles_service_pb2_grpc,
    )

    return profiles_service_pb2, profiles_service_pb2_grpc


def any_value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def summary(req):
    d = req.dictionary
    s = lambda i: d.string_table[i]
    profiles = []
    for rp in req.resource_profiles:
        resource = {kv.key: any_value(kv.value) for kv in rp.resource.attributes}
        for sp in rp.scope_profiles:
            for p in sp.profiles:
                functions, places, attrs, pids, frame_types, k8s = set(), set(), set(), {}, {}, {}
                for smp in p.samples:
                    for li in d.stack_table[smp.stack_index].location_indices:
                        loc = d.location_table[li]
                        for line in loc.lines:
                            f = d.function_table[line.function_index]
                            functions.add(s(f.name_strindex))
                            if f.filename_strindex:
                                places.add(f"{s(f.name_strindex)} ({os.path.basename(s(f.filename_strindex))}:{line.line})")
                        # profile.frame.type of the location, per function it names
                        for ai in loc.attribute_indices:
                            kv = d.attribute_table[ai]
                            if s(kv.key_strindex) == "profile.frame.type":
                                for line in loc.lines:
                                    fn = s(d.function_table[line.function_index].name_strindex)
                                    frame_types[fn] = any_value(kv.value)
                    a = {}
                    for ai in smp.attribute_indices:
                        kv = d.attribute_table[ai]
                        a[s(kv.key_strindex)] = any_value(kv.value)
                        attrs.add(s(kv.key_strindex))
                    pid = str(a.get("process.pid"))
                    pids[pid] = pids.get(pid, 0) + sum(smp.values)
                    if "k8s.pod.name" in a:
                        k8s[pid] = [a.get("k8s.namespace.name"), a.get("k8s.pod.name"), a.get("k8s.container.name")]
                build_ids = [
                    any_value(d.attribute_table[ai].value)
                    for m in d.mapping_table
                    for ai in m.attribute_indices
                    if s(d.attribute_table[ai].key_strindex) == "process.executable.build_id.gnu"
                ]
                profiles.append(
                    {
                        "sample_type": [s(p.sample_type.type_strindex), s(p.sample_type.unit_strindex)],
                        "period_type": [s(p.period_type.type_strindex), s(p.period_type.unit_strindex)],
                        "period": p.period,
                        "attributes": {
                            s(d.attribute_table[i].key_strindex): any_value(d.attribute_table[i].value)
                            for i in p.attribute_indices
                        },
                        "samples": len(p.samples),
                        "total": sum(sum(x.values) for x in p.samples),
                        "by_pid": pids,
                        "k8s_by_pid": k8s,
                        "functions": sorted(functions),
                        "places": sorted(places),
                        "frame_types": frame_types,
                        "sample_attributes": sorted(attrs),
                        "build_ids": len(build_ids),
                        "time_unix_nano": p.time_unix_nano,
                        "duration_nano": p.duration_nano,
                        "resource": resource,
                    }
                )
    return {"profiles": profiles}


def main():
    pb2, grpc_pb2 = compile_protos()
    if sys.argv[1] == "decode":
        req = pb2.ExportProfilesServiceRequest()
        with open(sys.argv[2], "rb") as f:
            req.ParseFromString(f.read())
        json.dump(summary(req), sys.stdout)
        return
    import grpc

    port, out = int(sys.argv[2]), sys.argv[3]
    stall = "--stall" in sys.argv
    counter = {"n": 0}
    lock = threading.Lock()

    class Service(grpc_pb2.ProfilesServiceServicer):
        def Export(self, request, context):
            if stall:
                time.sleep(3600)
            with lock:
                counter["n"] += 1
                n = counter["n"]
            with open(os.path.join(out, f"{n}.pb.tmp"), "wb") as f:
                f.write(request.SerializeToString())
            with open(os.path.join(out, f"headers-{n}.json"), "w") as f:
                json.dump({k: v for k, v in context.invocation_metadata()}, f)
            with open(os.path.join(out, f"{n}.json.tmp"), "w") as f:
                json.dump(summary(request), f)
            os.rename(os.path.join(out, f"{n}.pb.tmp"), os.path.join(out, f"{n}.pb"))
            os.rename(os.path.join(out, f"{n}.json.tmp"), os.path.join(out, f"{n}.json"))
            return pb2.ExportProfilesServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    grpc_pb2.add_ProfilesServiceServicer_to_server(Service(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()

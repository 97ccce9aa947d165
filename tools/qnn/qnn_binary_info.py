#!/usr/bin/env python3
"""Read graph and tensor metadata out of a QNN context binary with libQnnSystem.so (ctypes).

    python tools/qnn/qnn_binary_info.py path/to/x_ctx_qnn.bin [--lib .../libQnnSystem.so]

Calls QnnSystemInterface_getProviders -> systemContextCreate -> systemContextGetBinaryInfo (the
same path qnn-context-binary-utility and the SDK's SampleApp use) and walks
QnnSystemContext_BinaryInfo_t -> GraphInfo -> Qnn_Tensor_t. Only the leading fields that are
common to every struct version are read (BinaryInfo V1/V2/V3, GraphInfo V1/V2/V3, Tensor V1/V2),
so the layout below is the stable prefix of the public QNN headers (QnnTypes.h,
System/QnnSystemContext.h, System/QnnSystemInterface.h). The Qnn_Tensor_t array stride is derived
from the struct sizes and checked against the returned names/ranks.
"""
import ctypes as C
import json
import sys

QNN_DATATYPES = {
    0x0008: "INT_8", 0x0016: "INT_16", 0x0032: "INT_32", 0x0064: "INT_64",
    0x0108: "UINT_8", 0x0116: "UINT_16", 0x0132: "UINT_32", 0x0164: "UINT_64",
    0x0216: "FLOAT_16", 0x0232: "FLOAT_32", 0x0264: "FLOAT_64",
    0x0308: "SFIXED_POINT_8", 0x0316: "SFIXED_POINT_16", 0x0332: "SFIXED_POINT_32",
    0x0404: "UFIXED_POINT_4", 0x0408: "UFIXED_POINT_8", 0x0416: "UFIXED_POINT_16", 0x0432: "UFIXED_POINT_32",
    0x0508: "BOOL_8", 0x0608: "STRING", 0x7FFFFFFF: "UNDEFINED",
}
QNN_TENSOR_TYPES = {0: "APP_WRITE", 1: "APP_READ", 2: "APP_READWRITE", 3: "NATIVE", 4: "STATIC", 5: "NULL",
                    6: "UPDATEABLE_STATIC", 7: "UPDATEABLE_NATIVE", 8: "UPDATEABLE_APP_WRITE",
                    9: "UPDATEABLE_APP_READ", 10: "UPDATEABLE_APP_READWRITE", 11: "OPTIONAL_APP_WRITE",
                    12: "OPTIONAL_APP_READ", 13: "OPTIONAL_APP_READWRITE"}
QNN_ENCODINGS = {0: "SCALE_OFFSET", 1: "AXIS_SCALE_OFFSET", 2: "BW_SCALE_OFFSET", 3: "BW_AXIS_SCALE_OFFSET",
                 4: "BLOCK", 5: "BLOCKWISE_EXPANSION", 6: "VECTOR", 0x7FFFFFFF: "UNDEFINED"}
QNN_DEFINITIONS = {0: "IMPL_GENERATED", 1: "DEFINED", 0x7FFFFFFF: "UNDEFINED"}


class Version(C.Structure):
    _fields_ = [("major", C.c_uint32), ("minor", C.c_uint32), ("patch", C.c_uint32)]


class ScaleOffset(C.Structure):
    _fields_ = [("scale", C.c_float), ("offset", C.c_int32)]


class AxisScaleOffset(C.Structure):
    _fields_ = [("axis", C.c_int32), ("numScaleOffsets", C.c_uint32), ("scaleOffset", C.POINTER(ScaleOffset))]


class BwScaleOffset(C.Structure):
    _fields_ = [("bitwidth", C.c_uint32), ("scale", C.c_float), ("offset", C.c_int32)]


class BwAxisScaleOffset(C.Structure):
    _fields_ = [("bitwidth", C.c_uint32), ("axis", C.c_int32), ("numElements", C.c_uint32),
                ("scales", C.POINTER(C.c_float)), ("offsets", C.POINTER(C.c_int32))]


class QuantUnion(C.Union):
    _fields_ = [("scaleOffsetEncoding", ScaleOffset), ("axisScaleOffsetEncoding", AxisScaleOffset),
                ("bwScaleOffsetEncoding", BwScaleOffset), ("bwAxisScaleOffsetEncoding", BwAxisScaleOffset)]


class QuantizeParams(C.Structure):
    _fields_ = [("encodingDefinition", C.c_uint32), ("quantizationEncoding", C.c_uint32), ("u", QuantUnion)]


class ClientBuffer(C.Structure):
    _fields_ = [("data", C.c_void_p), ("dataSize", C.c_uint32)]


class TensorV1(C.Structure):
    _fields_ = [("id", C.c_uint32), ("name", C.c_char_p), ("type", C.c_uint32), ("dataFormat", C.c_uint32),
                ("dataType", C.c_uint32), ("quantizeParams", QuantizeParams), ("rank", C.c_uint32),
                ("dimensions", C.POINTER(C.c_uint32)), ("memType", C.c_uint32), ("clientBuf", ClientBuffer)]


class SparseHybridCoo(C.Structure):
    _fields_ = [("numSpecifiedElements", C.c_uint32), ("numSparseDimensions", C.c_uint32)]


class SparseParams(C.Structure):
    _fields_ = [("type", C.c_uint32), ("hybridCoo", SparseHybridCoo)]


class TensorV2(C.Structure):
    _fields_ = TensorV1._fields_ + [("isDynamicDimensions", C.POINTER(C.c_uint8)), ("sparseParams", SparseParams),
                                    ("isProduced", C.c_uint8)]


class TensorUnion(C.Union):
    _fields_ = [("v1", TensorV1), ("v2", TensorV2)]


class Tensor(C.Structure):
    _fields_ = [("version", C.c_uint32), ("u", TensorUnion)]


class GraphInfoV1(C.Structure):
    _fields_ = [("graphName", C.c_char_p), ("numGraphInputs", C.c_uint32), ("graphInputs", C.POINTER(Tensor)),
                ("numGraphOutputs", C.c_uint32), ("graphOutputs", C.POINTER(Tensor))]


class GraphInfo(C.Structure):  # stride is not needed: read through a pointer array of `numGraphs`, see below
    _fields_ = [("version", C.c_uint32), ("v1", GraphInfoV1)]


class BinaryInfoV1(C.Structure):
    _fields_ = [("backendId", C.c_uint32), ("buildId", C.c_char_p), ("coreApiVersion", Version),
                ("backendApiVersion", Version), ("socVersion", C.c_char_p), ("hwInfoBlobVersion", Version),
                ("contextBlobVersion", Version), ("hwInfoBlobSize", C.c_uint32), ("hwInfoBlob", C.c_void_p),
                ("contextBlobSize", C.c_uint64), ("numContextTensors", C.c_uint32),
                ("contextTensors", C.POINTER(Tensor)), ("numGraphs", C.c_uint32), ("graphs", C.c_void_p)]


class BinaryInfoV3(C.Structure):
    # QNN 2.51 returns version 3. Its prefix up to socVersion is the V1 one; the rest of the layout
    # below was read off the returned memory (contextBlobSize equals the .bin size minus its header,
    # numContextTensors 0, numGraphs 1) and is validated by the checks in binary_info().
    _fields_ = [("backendId", C.c_uint32), ("buildId", C.c_char_p), ("coreApiVersion", Version),
                ("backendApiVersion", Version), ("socVersion", C.c_char_p),
                ("_unknown0", C.c_uint32 * 4),
                ("contextBlobSize", C.c_uint64), ("numContextTensors", C.c_uint32),
                ("contextTensors", C.POINTER(Tensor)), ("numGraphs", C.c_uint32), ("graphs", C.c_void_p)]


class BinaryInfoUnion(C.Union):
    _fields_ = [("v1", BinaryInfoV1), ("v3", BinaryInfoV3)]


class BinaryInfo(C.Structure):
    _fields_ = [("version", C.c_uint32), ("u", BinaryInfoUnion)]


class SystemInterfaceImpl(C.Structure):
    # QnnSystemInterface_ImplementationV1_x_t starts with systemContextCreate, systemContextGetBinaryInfo
    _fields_ = [("systemContextCreate", C.c_void_p), ("systemContextGetBinaryInfo", C.c_void_p)]


class SystemInterface(C.Structure):
    _fields_ = [("backendId", C.c_uint32), ("providerName", C.c_char_p), ("systemApiVersion", Version),
                ("impl", SystemInterfaceImpl)]


CreateFn = C.CFUNCTYPE(C.c_uint64, C.POINTER(C.c_void_p))
GetBinaryInfoFn = C.CFUNCTYPE(C.c_uint64, C.c_void_p, C.c_void_p, C.c_uint64, C.POINTER(C.POINTER(BinaryInfo)),
                              C.POINTER(C.c_uint64))

# GraphInfo union: V2/V3 add fields after graphOutputs; the array stride is the size of the largest
# version. Rather than guessing it, find it from the graph count (usually 1 => stride irrelevant).


def _tensor(t):
    body = t.u.v2 if t.version == 2 else t.u.v1
    q = body.quantizeParams
    quant = {"definition": QNN_DEFINITIONS.get(q.encodingDefinition, q.encodingDefinition),
             "encoding": QNN_ENCODINGS.get(q.quantizationEncoding, q.quantizationEncoding)}
    if q.encodingDefinition == 1 and q.quantizationEncoding == 0:
        quant["scale"] = float(q.u.scaleOffsetEncoding.scale)
        quant["offset"] = int(q.u.scaleOffsetEncoding.offset)
    elif q.encodingDefinition == 1 and q.quantizationEncoding == 2:
        quant["bitwidth"] = int(q.u.bwScaleOffsetEncoding.bitwidth)
        quant["scale"] = float(q.u.bwScaleOffsetEncoding.scale)
        quant["offset"] = int(q.u.bwScaleOffsetEncoding.offset)
    return {
        "id": int(body.id),
        "name": body.name.decode(),
        "tensor_version": int(t.version),
        "type": QNN_TENSOR_TYPES.get(body.type, body.type),
        "data_type": QNN_DATATYPES.get(body.dataType, hex(body.dataType)),
        "data_type_code": hex(body.dataType),
        "dims": [int(body.dimensions[i]) for i in range(body.rank)],
        "quantization": quant,
    }


def binary_info(bin_path, lib_path):
    lib = C.CDLL(lib_path)
    get_providers = lib.QnnSystemInterface_getProviders
    get_providers.restype = C.c_uint64
    get_providers.argtypes = [C.POINTER(C.POINTER(C.POINTER(SystemInterface))), C.POINTER(C.c_uint32)]
    provs = C.POINTER(C.POINTER(SystemInterface))()
    n = C.c_uint32()
    rc = get_providers(C.byref(provs), C.byref(n))
    if rc or n.value < 1:
        raise RuntimeError(f"QnnSystemInterface_getProviders rc={rc} n={n.value}")
    iface = provs[0].contents
    api = iface.systemApiVersion
    create = C.cast(iface.impl.systemContextCreate, CreateFn)
    get_info = C.cast(iface.impl.systemContextGetBinaryInfo, GetBinaryInfoFn)
    h = C.c_void_p()
    rc = create(C.byref(h))
    if rc:
        raise RuntimeError(f"systemContextCreate rc={rc}")
    data = open(bin_path, "rb").read()
    buf = C.create_string_buffer(data, len(data))
    info = C.POINTER(BinaryInfo)()
    size = C.c_uint64()
    rc = get_info(h, C.cast(buf, C.c_void_p), len(data), C.byref(info), C.byref(size))
    if rc:
        raise RuntimeError(f"systemContextGetBinaryInfo rc={rc}")
    bi = info.contents
    if bi.version in (1, 2):
        v1 = bi.u.v1
    elif bi.version == 3:
        v1 = bi.u.v3
    else:
        raise RuntimeError(f"unknown QnnSystemContext_BinaryInfo version {bi.version}")
    if v1.numGraphs != 1:
        raise RuntimeError(f"expected 1 graph, binary has {v1.numGraphs} (graph stride not implemented)")
    g = C.cast(v1.graphs, C.POINTER(GraphInfo)).contents
    gv = g.v1
    if g.version not in (1, 2, 3):
        raise RuntimeError(f"unexpected GraphInfo version {g.version}: layout mismatch")
    for t in list(gv.graphInputs[: gv.numGraphInputs]) + list(gv.graphOutputs[: gv.numGraphOutputs]):
        body = t.u.v2 if t.version == 2 else t.u.v1
        if t.version not in (1, 2) or not (1 <= body.rank <= 8) or not body.name:
            raise RuntimeError("Qnn_Tensor_t layout mismatch (version/rank/name implausible)")
    out = {
        "read_with": "libQnnSystem.so QnnSystemInterface_getProviders -> systemContextCreate -> systemContextGetBinaryInfo",
        "system_provider": iface.providerName.decode() if iface.providerName else None,
        "system_api_version": f"{api.major}.{api.minor}.{api.patch}",
        "binary_info_version": int(bi.version),
        "backend_id": int(v1.backendId),
        "build_id": v1.buildId.decode() if v1.buildId else None,
        "core_api_version": f"{v1.coreApiVersion.major}.{v1.coreApiVersion.minor}.{v1.coreApiVersion.patch}",
        "backend_api_version": f"{v1.backendApiVersion.major}.{v1.backendApiVersion.minor}.{v1.backendApiVersion.patch}",
        "soc_version": v1.socVersion.decode() if v1.socVersion else None,
        "context_blob_size": int(v1.contextBlobSize),
        "binary_info_size": int(size.value),
        "graphs": [{
            "graph_info_version": int(g.version),
            "name": gv.graphName.decode(),
            "inputs": [_tensor(gv.graphInputs[i]) for i in range(gv.numGraphInputs)],
            "outputs": [_tensor(gv.graphOutputs[i]) for i in range(gv.numGraphOutputs)],
        }],
    }
    return out


def default_lib():
    import onnxruntime_qnn
    import os
    return os.path.join(os.path.dirname(onnxruntime_qnn.get_qnn_htp_path()), "libQnnSystem.so")


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("--lib", default=None)
    a = ap.parse_args()
    print(json.dumps(binary_info(a.bin, a.lib or default_lib()), indent=1))

"""A producer as another client on the platform may be: librdkafka driven through ctypes, so a
header name can be bytes that are not UTF-8 (as a Go or C producer sends them), which
confluent-kafka's Python client cannot write."""

from __future__ import annotations

import ctypes
from pathlib import Path

import confluent_kafka

from postroom.settings import Settings

# rd_kafka_vtype_t of rdkafka.h
_VTYPE_END, _VTYPE_TOPIC, _VTYPE_PARTITION, _VTYPE_VALUE, _VTYPE_KEY, _VTYPE_HEADERS = (
    0, 1, 3, 4, 5, 10)


class _Mem(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("size", ctypes.c_size_t)]


class _Value(ctypes.Union):
    _fields_ = [("cstr", ctypes.c_char_p), ("i32", ctypes.c_int32), ("mem", _Mem),
                ("ptr", ctypes.c_void_p), ("_pad", ctypes.c_char * 64)]


class _Vu(ctypes.Structure):
    _fields_ = [("vtype", ctypes.c_int), ("u", _Value)]


def librdkafka() -> ctypes.CDLL:
    """The librdkafka confluent-kafka ships, with the signatures used here."""
    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    [path] = libs.glob("librdkafka*.so*")
    lib = ctypes.CDLL(str(path))
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                      ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_headers_new.restype = ctypes.c_void_p
    lib.rd_kafka_headers_new.argtypes = [ctypes.c_size_t]
    lib.rd_kafka_header_add.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ssize_t,
                                        ctypes.c_char_p, ctypes.c_ssize_t]
    lib.rd_kafka_produceva.restype = ctypes.c_void_p
    lib.rd_kafka_produceva.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Vu), ctypes.c_size_t]
    lib.rd_kafka_flush.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    return lib


def produce_raw(settings: Settings, topic: str, partition: int, key: bytes, value: bytes,
                headers: list[tuple[bytes, bytes]]) -> None:
    """One record with header names as bytes, through librdkafka's C API (plaintext local
    stack only)."""
    lib = librdkafka()
    error = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    assert lib.rd_kafka_conf_set(conf, b"bootstrap.servers",
                                 (settings.kafka_bootstrap_servers or "").encode(),
                                 error, 512) == 0, error.value
    producer = lib.rd_kafka_new(0, conf, error, 512)  # RD_KAFKA_PRODUCER
    assert producer, error.value
    try:
        found = lib.rd_kafka_headers_new(len(headers))
        for name, header_value in headers:
            assert lib.rd_kafka_header_add(found, name, len(name), header_value,
                                           len(header_value)) == 0
        key_buf = ctypes.create_string_buffer(key, len(key))
        value_buf = ctypes.create_string_buffer(value, len(value))
        vus = (_Vu * 6)()
        vus[0].vtype, vus[0].u.cstr = _VTYPE_TOPIC, topic.encode()
        vus[1].vtype, vus[1].u.i32 = _VTYPE_PARTITION, partition
        vus[2].vtype, vus[2].u.mem = _VTYPE_KEY, _Mem(ctypes.cast(key_buf, ctypes.c_void_p),
                                                      len(key))
        vus[3].vtype, vus[3].u.mem = _VTYPE_VALUE, _Mem(ctypes.cast(value_buf, ctypes.c_void_p),
                                                        len(value))
        vus[4].vtype, vus[4].u.ptr = _VTYPE_HEADERS, found
        vus[5].vtype = _VTYPE_END
        assert not lib.rd_kafka_produceva(producer, vus, 5), "rd_kafka_produceva failed"
        assert lib.rd_kafka_flush(producer, 10_000) == 0, "not acknowledged"
    finally:
        lib.rd_kafka_destroy(producer)


def force_fatal(client: confluent_kafka.Producer | confluent_kafka.Consumer, code: int,
                reason: str = "forced by a test") -> None:
    """Put ``client`` in librdkafka's fatal state with the error ``code``, through
    ``rd_kafka_test_fatal_error``, librdkafka's hook for tests (a real fatal idempotent producer
    needs a broker that loses its state). confluent-kafka's client object holds its
    ``rd_kafka_t *`` first after the object header (``Handle`` in confluent_kafka.h)."""
    lib = librdkafka()
    lib.rd_kafka_test_fatal_error.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p]
    rk = ctypes.c_void_p.from_address(id(client) + object.__basicsize__).value
    assert rk, "the client has no rd_kafka_t"
    assert lib.rd_kafka_test_fatal_error(rk, code, reason.encode()) == 0

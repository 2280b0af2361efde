# Included by the twins that read the store's little-endian fields in place (records and
# consume-queue entries): unsigned integers of 2, 4 and 8 bytes at a pointer.
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t


cdef inline uint32_t _u32(const uint8_t* p) noexcept nogil:
    return p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline uint16_t _u16(const uint8_t* p) noexcept nogil:
    return p[0] | (<uint16_t>p[1] << 8)


cdef inline uint64_t _u64(const uint8_t* p) noexcept nogil:
    return _u32(p) | (<uint64_t>_u32(p + 4) << 32)

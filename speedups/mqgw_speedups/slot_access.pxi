# Included by the twins that read and write the fields of our own slotted classes (QueueRuntime,
# Consumer) for an object of exactly that class: the field's place in the object is read once
# from its slot descriptor, and each access is then a load at that offset, as Python's own
# specialized LOAD_ATTR_SLOT does. From C, `obj.field` costs a type lookup and a descriptor
# call per field (perf put them at a tenth of many-queues-1k's cycles). A class whose field is
# not a plain slot (a property, a dict attribute) makes slot_offset raise at the twin's import.
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from types import MemberDescriptorType

cdef extern from "structmember.h":
    ctypedef struct PyMemberDef:
        const char* name
        int type
        Py_ssize_t offset
        int flags
    int T_OBJECT_EX
    int READONLY

cdef extern from "Python.h":
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member


cdef Py_ssize_t slot_offset(type cls, str name) except -1:
    """Where ``cls``'s instances keep ``name``: the slot attribute lookup would find."""
    for klass in cls.__mro__:
        found = klass.__dict__.get(name)
        if found is not None:
            break
    else:
        raise TypeError(f"{cls.__name__} has no field {name!r}")
    if type(found) is not MemberDescriptorType:
        raise TypeError(f"{cls.__name__}.{name} is not a slot")
    cdef PyMemberDef* member = (<PyMemberDescrObject*>found).d_member
    if member.type != T_OBJECT_EX or member.flags & READONLY:
        raise TypeError(f"{cls.__name__}.{name} is not a writable object slot")
    return member.offset


cdef inline object get_slot(object obj, Py_ssize_t offset):
    """``obj``'s field at ``offset`` (from slot_offset of obj's exact class)."""
    cdef PyObject* value = (<PyObject**>((<char*><PyObject*>obj) + offset))[0]
    if value is NULL:
        raise AttributeError(f"a field of {type(obj).__name__} is not set")
    return <object>value


cdef inline void set_slot(object obj, Py_ssize_t offset, object value):
    """``obj``'s field at ``offset`` set to ``value``."""
    cdef PyObject** place = <PyObject**>((<char*><PyObject*>obj) + offset)
    cdef PyObject* old = place[0]
    Py_INCREF(value)
    place[0] = <PyObject*>value
    Py_XDECREF(old)


cdef inline void add_to_slot(object obj, Py_ssize_t offset, object amount) except *:
    """``obj``'s counter at ``offset`` raised by ``amount`` (``obj.field += amount``)."""
    set_slot(obj, offset, get_slot(obj, offset) + amount)

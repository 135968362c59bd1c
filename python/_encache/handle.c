/* SPDX-License-Identifier: Apache-2.0 */
/*
 * handle.c: an open handle's usability and its log callback (handle.h).
 */
#include "handle.h"

_Thread_local handle *ec_calling_back;

int ec_handle_usable(handle *h) {
  if (h->fork_gen != ec_fork_gen && h->ec != NULL) {
    ec_raise_fork("this Cache was opened in the parent process before "
                  "fork(): open a new Cache in the child");
    return -1;
  }
  if (h->ec == NULL) {
    ec_raise_closed("the Cache is closed");
    return -1;
  }
  if (h->locked_by == PyThread_get_thread_ident() || ec_calling_back == h) {
    ec_invalid("the Cache was called from code it runs (its log callable, "
               "or a finalizer of a tensor it releases): not allowed");
    return -1;
  }
  return 0;
}

int ec_handle_poisoned_locked(handle *h) {
  encache_stats st = ENCACHE_STATS_INIT;
  return encache_stats_get(h->ec, &st) < 0 || st.poisoned;
}

void ec_log(void *ctx, const char *message) {
  handle *h = ctx;
  PyGILState_STATE g = PyGILState_Ensure();
  handle *outer = ec_calling_back;
  ec_calling_back = h;
  if (h->log != NULL) {
    /* An exception may be propagating (a close from a deallocation). */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *text = ec_text(message);
    PyObject *r = text != NULL ? PyObject_CallOneArg(h->log, text) : NULL;
    Py_XDECREF(text);
    if (r == NULL)
      PyErr_WriteUnraisable(h->log);
    Py_XDECREF(r);
    PyErr_Restore(type, value, tb);
  }
  ec_calling_back = outer;
  PyGILState_Release(g);
}

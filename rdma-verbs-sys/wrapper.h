/* The rdma-core headers that rdma-verbs-sys binds. */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

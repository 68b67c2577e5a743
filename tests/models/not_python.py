def workload(mesh)
    return None

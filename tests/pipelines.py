"""Pipelines as stage 10's task 3 asks for (host bytes to host classes over lanes), and the usual mistakes
``lk.whole.check_pipeline`` and the bench's end-to-end rows must catch. The kit itself has no such loop (releases
must not hold the solution), so the tests that need one take it from here."""

from labkit import gpu


def pipeline(job, raw, classes, chunk, count):
    lanes = job.lanes(count)
    for k, start in enumerate(range(0, raw.shape[0], chunk)):
        lane, n = lanes[k % count], min(chunk, raw.shape[0] - start)
        b = job.upload(lane, raw[start:start + n])
        c = job.classes(lane, b, n)
        job.download(lane, c, classes[start:start + n])
    for lane in lanes:
        lane.synchronize()


def forgets_the_last_chunk(job, raw, classes, chunk, count):
    lanes = job.lanes(count)
    for k in range(raw.shape[0] // chunk):  # whole chunks only
        start, lane = k * chunk, lanes[k % count]
        c = job.classes(lane, job.upload(lane, raw[start:start + chunk]), chunk)
        job.download(lane, c, classes[start:start + chunk])
    for lane in lanes:
        lane.synchronize()


def forgets_to_synchronize(job, raw, classes, chunk, count):
    lanes = job.lanes(count)
    for k, start in enumerate(range(0, raw.shape[0], chunk)):
        lane, n = lanes[k % count], min(chunk, raw.shape[0] - start)
        job.download(lane, job.classes(lane, job.upload(lane, raw[start:start + n]), n), classes[start:start + n])


def mixes_lanes(job, raw, classes, chunk, count):
    lanes = job.lanes(count)
    for k, start in enumerate(range(0, raw.shape[0], chunk)):
        n = min(chunk, raw.shape[0] - start)
        b = job.upload(lanes[k % count], raw[start:start + n])
        c = job.classes(lanes[(k + 1) % count], b, n)  # another lane's bytes, no synchronization between
        job.download(lanes[(k + 1) % count], c, classes[start:start + n])
    for lane in lanes:
        lane.synchronize()


def downloads_on_another_lane(job, raw, classes, chunk, count):
    lanes = job.lanes(count)
    for k, start in enumerate(range(0, raw.shape[0], chunk)):
        lane, n = lanes[k % count], min(chunk, raw.shape[0] - start)
        c = job.classes(lane, job.upload(lane, raw[start:start + n]), n)
        with lanes[(k + 1) % count]:  # nothing orders this copy after the chunk's kernels on the other lane
            gpu.to_host(c, out=classes[start:start + n])
    for lane in lanes:
        lane.synchronize()


def makes_its_own_streams(job, raw, classes, chunk, count):
    from numba import cuda

    own = [cuda.stream() for _ in range(count)]  # work on these escapes the check's order model and delays
    for k, start in enumerate(range(0, raw.shape[0], chunk)):
        n = min(chunk, raw.shape[0] - start)
        classes[start:start + n] = job.serial(raw[start:start + n])
    for s in own:
        s.synchronize()

# The `leasehold` runtime image, made without pulling anything: the binary is built on the
# machine (`cargo build -p leasehold`, the dev profile in CI) and copied onto the locally made
# base image. Its runtime part is the same as host/Dockerfile's second stage, which users with a
# registry build from the sources. Build context: a directory holding only the binary
# (`./dev images` prepares it).
FROM leasehold-base:bookworm
RUN useradd --system --uid 10001 leasehold \
 && mkdir -p /jobs /data /cache && chown leasehold /cache
COPY leasehold /usr/local/bin/leasehold
USER leasehold
VOLUME ["/cache"]
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/leasehold"]
CMD ["run", "--jobs-dir", "/jobs", "--data-dir", "/data", "--cache-dir", "/cache", "--http", "0.0.0.0:8080"]

# Redis from Debian's packages, on the locally made base image (`./dev images`; README,
# "Container images"): the image the container tests use where no registry can be pulled
# from. docker-compose.yml names `redis:7`; docker-compose.local.yml swaps in this one.
FROM leasehold-base:bookworm
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* \
 && mkdir -p /data && chown redis:redis /data
COPY redis-entrypoint.sh /usr/local/bin/redis-entrypoint
WORKDIR /data
USER redis
EXPOSE 6379
ENTRYPOINT ["/usr/local/bin/redis-entrypoint"]
CMD ["redis-server"]

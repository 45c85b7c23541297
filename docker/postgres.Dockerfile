# PostgreSQL from Debian's packages, on the locally made base image (`./dev images`; README,
# "Container images"): the image the container tests use where no registry can be pulled
# from. docker-compose.yml names `postgres:15`; docker-compose.local.yml swaps in this one. Its
# entrypoint honours the official image's POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB and
# /docker-entrypoint-initdb.d/*.sql, so the compose file is the same for both.
FROM leasehold-base:bookworm
# No default cluster: the entrypoint makes its own in PGDATA.
RUN mkdir -p /etc/postgresql-common \
 && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.conf \
 && apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* \
 && mkdir -p /var/lib/postgresql/data /var/run/postgresql /docker-entrypoint-initdb.d \
 && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint
USER postgres
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint"]
CMD ["postgres"]

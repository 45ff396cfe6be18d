# mars2-local/postgres:15 — stands in for postgres:16 where no image registry is reachable: Debian bookworm's
# PostgreSQL 15 with an entrypoint that does what docker-compose.yml relies on in the official image
# (POSTGRES_USER/PASSWORD/DB, /docker-entrypoint-initdb.d on an empty data folder, TCP on 5432,
# `postgres -c ...` as the command). Built by docker/base-images.sh.
ARG DEBIAN_IMAGE=mars2-local/debian:bookworm
FROM ${DEBIAN_IMAGE}
# No cluster from the package: the entrypoint makes one in $PGDATA on first start.
RUN apt-get update \
 && apt-get install -y --no-install-recommends postgresql-common \
 && sed -ri 's/#?(create_main_cluster) .*$/\1 = false/' /etc/postgresql-common/createcluster.conf \
 && apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/postgresql/data /docker-entrypoint-initdb.d /var/run/postgresql \
 && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql \
 && chmod 0700 /var/lib/postgresql/data
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data \
    LANG=C.UTF-8
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
USER postgres
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]

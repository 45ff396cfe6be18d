-- Runs once, when the postgres volume is empty (docker-entrypoint-initdb.d), as the superuser
-- POSTGRES_USER, inside the database POSTGRES_DB that the entrypoint already created (Prefect's).
-- Adds MLflow's own role and database next to Prefect's. The password comes from the container's
-- environment (MLFLOW_DB_PASSWORD, set in .env): no credential is written in this repository.
\getenv mlflow_password MLFLOW_DB_PASSWORD
CREATE ROLE mlflow WITH LOGIN PASSWORD :'mlflow_password';
CREATE DATABASE mlflow OWNER mlflow;
-- Postgres >= 15 no longer lets every role create in schema public; the database owner still can,
-- which is all MLflow's migrations need.
GRANT ALL PRIVILEGES ON DATABASE mlflow TO mlflow;
